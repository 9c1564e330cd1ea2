"""A job's exception as the client sees it: a ``JobFailed`` that is also an instance of the job's own class.

On the worker, :func:`capture` (the ``submit`` task calls it as the user's function raises) packs the
exception before Celery replaces it: Celery stores only what plain ``pickle`` round-trips, and puts an
``UnpickleableExceptionWrapper`` in place of the rest (a class from the user's ``__main__``, an
``__init__`` whose arguments are not its ``args``). The pack (:func:`pack`) holds the class, the
arguments its ``__reduce__`` gives, its ``args`` and its attributes, pickled the way functions travel
(``payload.dumps``: a class sent by value comes back as the client's own class), its message, and the
traceback as raised; the result backend stores it beside Celery's record (``RECORD_KEY``).

On the client, :func:`failure` rebuilds the remote exception and makes the error both a ``JobFailed``
(or ``GangFailed``) and the remote class: ``type(f"JobFailed[{T.__name__}]", (JobFailed, T), ...)``,
made once per class (:func:`typed_class`). Its ``args`` and attributes are the remote exception's
(``e.args[0]`` of a ``KeyError`` is the missing key, an ``OSError`` keeps ``errno`` and ``filename``);
an attribute it lacks is looked up on the rebuilt exception (``err.exception``). Left plain ``JobFailed``:
a class the client cannot import; one that cannot be subclassed together with ``JobFailed`` (a layout
or metaclass conflict); and ``BaseException`` subclasses that are not ``Exception`` (``SystemExit``,
``KeyboardInterrupt``, ``GeneratorExit``): raised in the client they would stop it, and ``except Exception``
would not see the job's failure.
"""

from __future__ import annotations

import importlib
import pickle
import sys
import threading
import traceback as tb_module
from typing import Any

from .errors import GangFailed, JobFailed
from .masking import mask_text

RECORD_KEY = "gl_exc"  # the key of the pack in Celery's exception record (a dict with exc_type, exc_module, ...)
PACK_MAX = 64 * 1024  # bytes of a pickled exception kept; a bigger one (it holds a large value) keeps its name
_MESSAGE_MAX = 20_000  # characters of a message kept

_lock = threading.Lock()
_classes: dict[tuple[type, type], type | None] = {}  # (JobFailed or GangFailed, T) -> JobFailed[T], or None
_captured = threading.local()  # .job: (job id, pack) of the job this thread ran that raised


# -- on the worker --------------------------------------------------------------------------------------------
def capture(job_id: str, exc: BaseException) -> None:
    """The job ``job_id`` raised ``exc``: keep its pack for the result backend (``take_captured``)."""
    try:
        _captured.job = (job_id, pack(exc, tb_module.format_exc()))
    except Exception:  # never let packing hide the job's own failure
        _captured.job = None


def take_captured(job_id: str) -> dict | None:
    """The pack :func:`capture` kept for ``job_id`` (once), else None."""
    kept = getattr(_captured, "job", None)
    if kept is None or kept[0] != job_id:
        return None
    _captured.job = None
    return kept[1]


def pack(exc: BaseException, traceback: str | None = None) -> dict:
    """What travels of ``exc``: ``module``, ``qualname``, ``message``, maybe ``traceback``, and ``pickle`` when
    the exception's parts pickle in at most ``PACK_MAX`` bytes."""
    cls = type(exc)
    out: dict[str, Any] = {"module": cls.__module__, "qualname": cls.__qualname__, "message": _message(exc)}
    if traceback:
        out["traceback"] = traceback
    from .payload import dumps

    # A job's own JobFailed (it waited on another job) pickles as itself; any other exception as its parts,
    # then without its attributes (they may not pickle).
    for parts in ((exc,) if isinstance(exc, JobFailed) else ()) + (_Parts(exc), _Parts(exc, state=False)):
        try:
            blob = dumps(parts)
            pickle.loads(blob)  # it must come back (a class only this worker can rebuild does not)
        except Exception:
            continue
        if len(blob) <= PACK_MAX:
            out["pickle"] = blob
        break
    return out


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = ""
    if not text:
        try:
            text = repr(exc)
        except Exception:
            text = type(exc).__name__
    return text[:_MESSAGE_MAX]


class _Parts:
    """An exception pickled as its class and parts, rebuilt by :func:`_rebuild_exception` without relying on its
    ``__init__`` accepting its own ``args`` (plain pickle calls ``cls(*args)``)."""

    def __init__(self, exc: BaseException, state: bool = True):
        self.cls = type(exc)
        self.init_args, self.args = _init_args(exc), tuple(exc.args)
        self.state = _state(exc) if state else ({}, {})

    def __reduce__(self):
        return _rebuild_exception, (self.cls, self.init_args, self.args, self.state)


def _init_args(exc: BaseException) -> tuple:
    """The arguments ``type(exc)(...)`` was, as far as its ``__reduce__`` says, built from: an ``OSError``'s
    carry its file name, which its ``args`` do not."""
    try:
        reduced = exc.__reduce_ex__(2)
        if isinstance(reduced, tuple) and len(reduced) >= 2 and reduced[0] is type(exc) \
                and isinstance(reduced[1], tuple):
            return reduced[1]
    except Exception:
        pass
    return tuple(exc.args)


def _slot_names(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
    return names


def _state(exc: BaseException) -> tuple[dict, dict]:
    """``exc``'s instance attributes and ``__slots__`` values (its ``args`` apart)."""
    attrs = dict(getattr(exc, "__dict__", None) or {})
    slots = {}
    for name in _slot_names(type(exc)):
        try:
            slots[name] = getattr(exc, name)
        except AttributeError:
            pass
    return attrs, slots


def _apply_state(obj: BaseException, args: tuple, state: tuple[dict, dict], skip: tuple[str, ...] = ()) -> None:
    try:
        obj.args = args
    except Exception:
        pass
    attrs, slots = state
    for name, value in list(attrs.items()) + list(slots.items()):
        if name in skip:
            continue
        try:
            object.__setattr__(obj, name, value)
        except Exception:
            pass


def _rebuild_exception(cls: type, init_args: tuple, args: tuple, state: tuple[dict, dict]) -> BaseException:
    try:
        obj = cls(*init_args)
    except Exception:  # an __init__ that its own args do not fit: build it without calling it
        obj = cls.__new__(cls, *args)
        BaseException.__init__(obj, *args)
    _apply_state(obj, args, state)
    return obj


# -- on the client ----------------------------------------------------------------------------------------------
def unpack(packed: dict | None) -> BaseException | None:
    """The remote exception rebuilt from its pack, or None (no pickle, or its class is not importable here)."""
    blob = (packed or {}).get("pickle")
    if not blob:
        return None
    try:
        exc = pickle.loads(blob)  # inside the signed result: as trusted as the result itself
    except Exception:
        return None
    return exc if isinstance(exc, BaseException) else None


ENGINE_PACKAGES = ("celery", "kombu", "billiard", "vine")  # their errors are the engine's, not the job's own


def find_class(module: str | None, qualname: str | None) -> type | None:
    """The exception class ``module.qualname`` in this process (imported if need be), or None; None too for the
    engine's own classes (a message that could not be decoded is no exception of the job's)."""
    if not module or not qualname or "<locals>" in qualname or module.partition(".")[0] in ENGINE_PACKAGES:
        return None
    mod = sys.modules.get(module)
    if mod is None:
        if module in ("__main__", "__mp_main__"):
            return None
        try:
            mod = importlib.import_module(module)
        except Exception:
            return None
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


def typed_class(base: type[JobFailed], remote: type | None) -> type | None:
    """``base[remote]``: a subclass of both, made once per pair; None where there can be none (see the module)."""
    if remote is not None and issubclass(remote, JobFailed):  # a job re-raised another job's failure
        remote = remote.remote_type
    if remote is None or not isinstance(remote, type) or not issubclass(remote, Exception) or issubclass(base, remote):
        return None
    key = (base, remote)
    with _lock:
        if key in _classes:
            return _classes[key]
        name = f"{base.__name__}[{remote.__name__}]"
        namespace = {"__module__": base.__module__, "__qualname__": name, "remote_type": remote,
                     "__reduce__": _reduce_typed, "__getattr__": _from_remote, "__str__": base.__str__,
                     "__doc__": f"A {base.__name__} whose job raised {remote.__module__}.{remote.__qualname__}."}
        try:
            cls = type(name, (base, remote), namespace)
        except TypeError:  # a layout or metaclass conflict, or a class that cannot be subclassed
            cls = None
        _classes[key] = cls
        return cls


def _from_remote(self, name: str):
    """An attribute the error lacks, from the rebuilt remote exception (a property of the user's class)."""
    remote = self.__dict__.get("exception") if not name.startswith("__") else None
    if remote is None:
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
    return getattr(remote, name)


_FIELDS = ("type_name", "message", "traceback", "job_id", "worker")


def _reduce_typed(self):
    fields = tuple(self.__dict__.get(f) for f in _FIELDS)
    extra = {k: v for k, v in self.__dict__.items() if k not in _FIELDS and k != "exception"}
    remote = self.__dict__.get("exception")
    return _rebuild_typed, (type(self).__mro__[1], self.remote_type, fields, tuple(self.args),
                            _Parts(remote) if remote is not None else None, extra)


def _rebuild_typed(base, remote_type, fields, args, remote, extra):
    err = typed(base, remote_type, *fields, remote=remote, args=args)
    err.__dict__.update(extra)
    return err


def typed(base: type[JobFailed], remote_type: type | None, type_name: str, message: str, traceback: str | None,
          job_id: str | None, worker: str | None, remote: BaseException | None = None,
          args: tuple | None = None) -> JobFailed:
    """``base[remote_type]`` with the remote exception's args and attributes, or a plain ``base``."""
    cls = typed_class(base, remote_type)
    if remote is not None:  # what ``err.exception`` shows, masked as the error's own args
        try:
            remote.args = _masked(tuple(remote.args))
        except Exception:
            pass
    if cls is None:
        err = base(type_name, message, traceback, job_id, worker)
        err.exception = remote
        return err
    if remote is not None:
        args, init_args, state = tuple(remote.args), _init_args(remote), _state(remote)
    else:
        args = tuple(args) if args is not None else (message,)
        init_args, state = args, ({}, {})
    # The error's repr shows its args, as the message does: a URL's password in them is masked alike.
    args, init_args = _masked(args), _masked(init_args)
    state = ({k: _masked_one(v) for k, v in state[0].items()}, {k: _masked_one(v) for k, v in state[1].items()})
    try:
        err = cls.__new__(cls, *args)
    except Exception:
        err = cls.__new__(cls)
    real = cls.remote_type
    try:
        real.__init__(err, *init_args)  # the C parts (an OSError's errno, filename) are set by its own __init__
    except Exception:
        BaseException.__init__(err, *args)
    _apply_state(err, args, state, skip=_FIELDS + ("exception",))  # the error's own fields win a clash
    err._fill(type_name, message, traceback, job_id, worker)
    err.exception = remote
    return err


def _masked_one(value: Any) -> Any:
    return mask_text(value) if isinstance(value, str) else value


def _masked(values: tuple) -> tuple:
    """``values`` with a URL's password in each string masked (``masking.mask_text``), the rest as they are."""
    return tuple(_masked_one(v) for v in values)


def failure(base: type[JobFailed], type_name: str, message: str, traceback: str | None, job_id: str | None,
            worker: str | None, packed: dict | None = None, args: tuple | None = None,
            module: str | None = None, qualname: str | None = None) -> JobFailed:
    """The client's error for a remote failure: ``packed`` (:func:`pack`) rebuilt, else the class found by
    ``module``/``qualname`` with ``args``, else a plain ``base``."""
    remote = unpack(packed)
    cls = type(remote) if remote is not None else find_class(module, qualname)
    return typed(base, cls, type_name, message, traceback, job_id, worker, remote=remote, args=args)


def gang_failure(err: GangFailed, report: dict | None) -> GangFailed:
    """``err`` typed as the failed rank's own exception (its report's ``exc_module``/``exc_qualname``/``exc_pack``)."""
    if not report or not report.get("exc_qualname"):
        return err
    packed = None
    blob = report.get("exc_pack")
    if blob:
        import base64

        try:
            packed = {"pickle": base64.b64decode(blob)}
        except Exception:
            packed = None
    out = failure(type(err), err.type_name, err.message, err.traceback, err.job_id, err.worker, packed,
                  module=report.get("exc_module"), qualname=report.get("exc_qualname"))
    out.rank, out.exit_code = err.rank, err.exit_code
    return out
