"""Celery's canvas for ``submit``: where a signature keeps its function, and map / starmap / chunks.

Celery hands a previous result (a chain step, a ``link``, a chord body) or
partial arguments (``sig.delay(1)``, ``sig.clone(args=...)``) to the next task
by prepending them to the signature's positional arguments. A ``submit``
signature therefore keeps its function out of them, in the ``gl_function``
option, so Celery's own merging gives ``fn(prev, *args)``; the message to a
worker is still ``(packed_fn, *args)``.

``map`` / ``starmap`` / ``chunks`` follow Celery's semantics but are built on
``submit`` itself: Celery's ``celery.map`` builtins call the task object inside
a worker and go to a queue no gpulayer worker reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from celery.canvas import Signature, group

from .app import SUBMIT
from .errors import PayloadError
from .payload import FunctionRef, check_function, pack_function, resolve_function, summarize

#: The signature option that carries a ``submit`` signature's function (raw callable or "pkg.mod:fn").
FUNCTION_OPTION = "gl_function"

MAP = "gpulayer.canvas:apply_map"
STARMAP = "gpulayer.canvas:apply_starmap"


def take_function(sig: Signature) -> Signature:
    """Move the function out of a new ``submit`` signature's positional args into its options."""
    if FUNCTION_OPTION in sig.options:
        return sig
    if not sig.args:
        raise PayloadError("submit.s() needs the function to run as its first argument: submit.s(fn, *args); "
                           "a previous result in a chain or chord is then passed as fn's first argument")
    fn, *rest = sig.args
    check_function(fn, form="submit.s")
    sig.args = tuple(rest)
    sig.options[FUNCTION_OPTION] = fn
    return sig


def function_and_args(sig: Signature) -> tuple[Any, tuple]:
    """A ``submit`` signature's function and its positional args (the function never among them)."""
    if FUNCTION_OPTION in sig.options:
        return sig.options[FUNCTION_OPTION], tuple(sig.args)
    if not sig.args:
        raise PayloadError(f"signature {sig!r} names no function to run; build it with submit.s(fn, *args)")
    return sig.args[0], tuple(sig.args[1:])


def later_signatures(*items: Any) -> Iterator[Signature]:
    """Every ``submit`` signature a message will apply later (its chain, links, chord body), flattened."""
    for item in items:
        if item is None:
            continue
        if isinstance(item, (list, tuple)):
            yield from later_signatures(*item)
        elif isinstance(item, dict):
            sig = item if isinstance(item, Signature) else Signature.from_dict(item)
            if sig.get("subtask_type") in ("group", "chain"):
                yield from later_signatures(list(sig.tasks))
            elif sig.get("subtask_type") == "chord":
                yield from later_signatures(list(sig.tasks), sig.body)
            elif sig.task == SUBMIT:
                yield sig


# -- map / starmap / chunks: run on a worker as one submit job each ---------------------------------

def apply_map(items: Iterable, *, func: FunctionRef) -> list:
    """``[func(x) for x in items]`` inside one job (``submit.map``)."""
    f = resolve_function(func)
    return [f(x) for x in items]


def apply_starmap(items: Iterable, *, func: FunctionRef) -> list:
    """``[func(*x) for x in items]`` inside one job (``submit.starmap``, each chunk of ``submit.chunks``)."""
    f = resolve_function(func)
    return [f(*x) for x in items]


def map_signature(task, fn: Callable | str, items: Iterable, *, star: bool, resources=None) -> Signature:
    """One ``submit`` signature that applies ``fn`` to every item on one worker and returns the list."""
    check_function(fn, form="submit.starmap" if star else "submit.map")
    items = list(items)
    kwargs: dict[str, Any] = {"func": pack_function(fn)}
    if resources is not None:
        kwargs["resources"] = resources
    form = "starmap" if star else "map"
    return task.signature((items,), kwargs, gl_function=STARMAP if star else MAP,
                          argsrepr=summarize(form, (fn, items)))


class chunks(Signature):
    """``submit.chunks(fn, items, n)``: a group of starmap jobs of ``n`` items each; result a list of lists.

    >>> submit.chunks(pow, zip(range(10), [2] * 10), 5).apply_async().get()
    [[0, 1, 4, 9, 16], [25, 36, 49, 64, 81]]
    """

    def __init__(self, task, fn: Callable | str, items: Iterable, n: int, resources=None, **options):
        check_function(fn, form="submit.chunks")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"submit.chunks needs a chunk size n >= 1, got {n!r}")
        self._submit = task
        super().__init__("gpulayer.chunks", (), {"fn": fn, "items": list(items), "n": n, "resources": resources},
                         immutable=True, app=task.app, **options)

    def group(self) -> group:
        kw = self.kwargs
        it = iter(kw["items"])
        parts = iter(lambda: list(islice(it, kw["n"])), [])
        return group([map_signature(self._submit, kw["fn"], part, star=True, resources=kw["resources"])
                      for part in parts], app=self.app)

    def apply_async(self, args=None, kwargs=None, **options):
        if args or kwargs:
            raise PayloadError("submit.chunks(...) takes no partial arguments: put every item in its items")
        return self.group().apply_async(**options)

    def __call__(self, **options):
        return self.apply_async(**options)

    def __or__(self, other):
        return self.group() | other
