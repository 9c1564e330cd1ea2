"""Object refs on the job path: large values leave the message before it is sent, refs come back as values.

A job's message carries small things only. Before it is published, every argument over ``inline_limit_bytes``
goes to the object store and travels as an auto ``ObjectRef``, and every ref among the arguments (top level,
or inside lists, tuples and dicts) gets the holder ``arg:<job id>``, so nothing the job needs is deleted
while it waits in its queue. On the worker, the job's pool process turns the refs back into values before the
function runs (never the worker's main process: its heartbeats never wait behind a transfer), and drops the
job's ``arg:`` holders once the job reaches its final state (a try that is sent again keeps them). A result
over the limit becomes an auto ref held by ``res:<job id>`` for as long as the result is kept; the refs
inside a result get that holder too. A client's ``get`` gives the value of an auto ref (an explicit ref,
``gpulayer.put``'s, stays a ref) and ``forget()`` drops the ``res:`` holder, and with it the object.

The tiny job pays a type check per argument (``plain``): ints, floats, short strings and the like can be
neither large nor a ref.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import redis

from ..objects.ref import ObjectRef, refs_in
from ..payload import PickledFunction
from ..store import keys

REFS_DEPTH = 4  # how deep inside containers refs are found (``refs_in``'s default) and replaced

# Values that can be neither a ref nor large, told by their type alone (a short str or bytes by its length too).
_FLAT = frozenset({int, float, bool, complex, type(None), PickledFunction})
_SHORT = 4096  # a str or bytes this long is inline whatever the limit


def plain(values: Iterable) -> bool:
    """Is every value one that travels inline as it is, told by its type (no ref, nothing large)?"""
    for value in values:
        kind = type(value)
        if kind in _FLAT or ((kind is str or kind is bytes) and len(value) < _SHORT):
            continue
        return False
    return True


def plain_call(args: tuple, kwargs: dict) -> bool:
    """``plain`` over a call's positional and keyword arguments."""
    return (not args or plain(args)) and (not kwargs or plain(kwargs.values()))


# -- replacing refs inside containers ----------------------------------------------------------------------------

_CONTAINERS = (list, tuple, set, frozenset)


def swap_refs(value: Any, swap, depth: int = REFS_DEPTH) -> Any:
    """``value`` with every ref ``refs_in`` finds in it replaced by ``swap(ref)`` (inside lists, tuples, sets and
    dicts' values, to ``depth``); a container without one is kept as it is (the same object), one with one is
    rebuilt as its own type."""
    kind = type(value)
    if kind is ObjectRef:
        return swap(value)
    if depth <= 0 or kind in _FLAT:
        return value
    if kind is dict:
        out = {k: swap_refs(v, swap, depth - 1) for k, v in value.items()}
        return value if all(out[k] is v for k, v in value.items()) else out
    if kind not in _CONTAINERS:
        return value
    items = [swap_refs(v, swap, depth - 1) for v in value]
    return value if all(a is b for a, b in zip(items, value)) else kind(items)


# -- the client: before a job is published ------------------------------------------------------------------------

def _until() -> float:
    """When a holder taken now expires unless dropped first: as a result stored now would (``result_expires``)."""
    from .. import app

    return time.time() + app.settings().result_expires


def for_job(args: tuple, kwargs: dict, job_id: str, client) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of job ``job_id`` as its message carries them: each value over the inline limit as an
    auto ref, and every ref among them held by ``arg:<job id>``; call it before the job is published. A ref
    already gone, or a value the store cannot take, raises here (nothing was sent), leaving no holder behind."""
    from .. import objects

    holder = objects.arg_holder(job_id)
    held: list[ObjectRef] = list({ref.oid: ref for value in (*args, *kwargs.values()) for ref in refs_in(value)}
                                 .values())
    if held:
        objects.hold(client, held, holder, _until())
    try:
        args = tuple(_offloaded(value, holder, client, held, f"argument {i + 1}") for i, value in enumerate(args))
        kwargs = {name: _offloaded(value, holder, client, held, f"argument {name}=")
                  for name, value in kwargs.items()}
    except BaseException:
        if held:
            objects.release(client, held, holder)
        raise
    if held:  # what a cancel of the job lets go of (``cancelled``)
        index, pipe = keys.job_objects(job_id), client.pipeline(transaction=False)
        pipe.sadd(index, *{ref.oid for ref in held})
        pipe.expire(index, int(_until() - time.time()) + 60)
        pipe.execute()
    return args, kwargs


def cancelled(client, job_ids) -> int:
    """Jobs cancelled (dropped from their queue, or killed): each lets go of the objects its arguments held, as it
    would have at its final state. Returns how many objects were deleted."""
    from .. import objects

    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.smembers(keys.job_objects(job_id))
    deleted = 0
    for job_id, oids in zip(job_ids, pipe.execute()):
        if oids:
            deleted += objects.release(client, [oid.decode() for oid in oids], objects.arg_holder(job_id))
    return deleted


def _offloaded(value, holder: str, client, made: list, what: str) -> Any:
    if type(value) is ObjectRef or plain((value,)):
        return value
    out = offload(value, holder, client, what)
    if out is not value:
        made.append(out)
    return out


def offload(value, holder: str, client, what: str) -> Any:
    """``objects.offload``, its refusal naming ``what`` was refused (``argument 2``, ``the job's result``): the
    store's own error gives the size, why and what to do, but not what was being sent."""
    from .. import objects
    from ..errors import GpulayerError, PayloadError
    from ..objects import format as fmt

    try:
        return objects.offload(value, holder, client)
    except PayloadError as err:  # no store to go to, or no room in it: its message has the size and the fix
        shown = fmt.summary(value, 0).removesuffix(" 0 B")  # what it is: Tensor[2000000]:float32
        raise type(err)(f"{what} ({shown}): {err}") from err
    except (GpulayerError, redis.RedisError, OSError):
        raise
    except Exception:  # it does not pickle: left inline, for the message's serializer to say so as for any value
        return value


def for_later(later: tuple | None, client) -> None:
    """``for_job`` for the steps a message carries (a chain's next steps, a chord's body, links): their own
    arguments travel inside it too. Each ``submit`` signature with an id is changed in place."""
    if not later:
        return
    from celery.canvas import Signature

    from ..app import SUBMIT

    def steps(items):
        for item in items:
            if isinstance(item, (list, tuple)):
                yield from steps(item)
            elif isinstance(item, Signature):
                kind = item.get("subtask_type")
                if kind in ("group", "chain"):
                    yield from steps(item.tasks)
                elif kind == "chord":
                    yield from steps((item.tasks, item.body))
                elif item.task == SUBMIT:
                    yield item

    for sig in steps(later):
        job_id = sig.options.get("task_id")
        args, kwargs = tuple(sig.args or ()), dict(sig.kwargs or {})
        if job_id and not plain_call(args, kwargs):
            sig.args, sig.kwargs = for_job(args, kwargs, job_id, client)


# -- the worker: in the job's pool process --------------------------------------------------------------------

_held: dict[str, list[ObjectRef]] = {}  # job id -> the refs its arguments held, until the job's final state


def resolve(args, kwargs: dict, job_id: str) -> tuple[tuple, dict]:
    """The job's arguments with every ref replaced by its value (read from the store, or this host's cache).

    The refs stored inside an auto ref's value (a large list holding refs) are values too; every ref seen is
    kept for ``job_ended``."""
    from .. import objects

    _held.clear()  # one job at a time per process: what is left is a try sent again (its next try holds them)
    seen: dict[str, Any] = {}  # oid -> its value: a ref passed twice is read once
    _held[job_id] = held = []

    def value(ref: ObjectRef):
        if ref.oid in seen:
            return seen[ref.oid]
        held.append(ref)
        got = objects.read(ref)
        got = seen[ref.oid] = swap_refs(got, value) if ref.auto and not plain((got,)) else got
        return got

    return tuple(swap_refs(a, value) for a in args), {k: swap_refs(v, value) for k, v in kwargs.items()}


def job_ended(job_id: str, client) -> None:
    """Job ``job_id`` reached its final state: drop its ``arg:`` holders (an object left with none is deleted).

    ``client``: a callable giving the Redis client, called only when there is something to release."""
    held = _held.pop(job_id, None)
    if held:
        from .. import objects

        r = client()
        objects.release(r, held, objects.arg_holder(job_id))
        r.delete(keys.job_objects(job_id))  # (a cancel has nothing left to let go of)


def for_result(value, job_id: str, client, expires) -> Any:
    """What a job's result is stored as: ``value``, or an auto ref over the inline limit; the refs inside it are
    held by ``res:<job id>`` for as long as the result is kept (``expires()`` seconds).

    ``client`` and ``expires``: callables, called only for a result that is not ``plain``."""
    if type(value) in _FLAT or plain((value,)):
        return value
    from .. import objects

    holder = objects.res_holder(job_id)
    inner = refs_in(value)
    if inner:
        objects.hold(client(), inner, holder, time.time() + expires())
    return offload(value, holder, client(), "the job's result")


# -- the client: reading results ------------------------------------------------------------------------------

def value_of(result: Any) -> Any:
    """A job's result as its caller sees it: an auto ref's value (the ref of a large result), else ``result``."""
    if type(result) is ObjectRef and result.auto:
        from .. import objects

        return objects.read(result)
    return result


def forget_result(handle) -> None:
    """Before ``handle.forget()``: drop ``res:<job id>`` from the objects its stored result holds."""
    from celery import states

    meta = handle._cache or handle.backend.get_task_meta(handle.id)
    result = meta.get("result")
    if meta.get("status") != states.SUCCESS or plain((result,)):
        return
    held = refs_in(result)
    if held:
        from .. import objects

        objects.release(handle.backend.client, held, objects.res_holder(handle.id))
