"""What a job carries: its function (by reference or by value) and a readable summary.

Functions from installed packages travel by reference; the user's own code
(``__main__``, a script's modules, closures, lambdas) travels by value through
cloudpickle, so a worker does not need the user's source tree.
"""

from __future__ import annotations

import hashlib
import importlib
import reprlib
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any, Callable, NamedTuple

import cloudpickle

from .errors import PayloadError

_SUMMARY_LIMIT = 200


class PickledFunction(NamedTuple):
    """A callable pickled once by value; ``digest`` lets workers cache the loaded function."""

    digest: bytes
    blob: bytes
    name: str


FunctionRef = str | PickledFunction


def check_function(fn: Any, form: str = "submit") -> None:
    """Refuse what cannot be a job's function, naming the call (``form``) that was given it.

    Also marks the user's own modules to travel by value, so a signature that keeps
    the raw function (a chain step inside a message) pickles like a packed one.
    """
    if isinstance(fn, PickledFunction):
        return
    if isinstance(fn, str):
        mod, sep, attr = fn.partition(":")
        if not sep or not mod or not attr:
            raise PayloadError(f"function reference {fn!r} is not of the form 'package.module:function'")
        return
    if not callable(fn):
        raise PayloadError(f"{form} needs a callable or a 'pkg.mod:fn' string as its first argument, "
                           f"got {type(fn).__name__} {_short(fn)}")
    _pickle_user_module_by_value(fn)


def pack_function(fn: Callable | str) -> FunctionRef:
    """Turn ``fn`` into what travels: ``"pkg.mod:fn"`` as is, any callable pickled by value."""
    if isinstance(fn, PickledFunction):
        return fn
    check_function(fn)
    if isinstance(fn, str):
        return fn
    try:
        blob = cloudpickle.dumps(fn)
    except Exception as err:
        raise PayloadError(f"cannot pickle function {function_name(fn)}: {type(err).__name__}: {err}; "
                           "it probably captures an open file, lock, socket or similar object: "
                           "create that object inside the function instead") from err
    return PickledFunction(hashlib.blake2b(blob, digest_size=16).digest(), blob, function_name(fn))


_loaded: dict[bytes, Callable] = {}
_loaded_lock = threading.Lock()


def resolve_function(ref: FunctionRef) -> Callable:
    """The callable behind ``ref``, loaded once per worker process."""
    if isinstance(ref, PickledFunction):
        fn = _loaded.get(ref.digest)
        if fn is None:
            fn = cloudpickle.loads(ref.blob)
            with _loaded_lock:
                if len(_loaded) > 512:
                    _loaded.clear()
                _loaded[ref.digest] = fn
        return fn
    if isinstance(ref, str):
        return _import_ref(ref)
    raise PayloadError(f"job function has unexpected type {type(ref).__name__}")


def _import_ref(ref: str) -> Callable:
    mod_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise PayloadError(f"cannot load {ref!r} on this worker: {err}; install the package on every "
                           "worker, or pass the function object itself to send it by value") from err
    return obj


def function_name(fn: Callable | FunctionRef) -> str:
    if isinstance(fn, PickledFunction):
        return fn.name
    if isinstance(fn, str):
        return fn.partition(":")[2] or fn
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


_repr = reprlib.Repr()
_repr.maxstring = 40
_repr.maxother = 40
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4
_repr.maxlevel = 2


def _short(value: Any) -> str:
    if isinstance(value, PickledFunction):
        return value.name  # a function travelling by value: its name, never its bytes
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"{type(value).__name__}{list(shape)}:{value.dtype}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{type(value).__name__} {len(value)}>"
    if callable(value) and not isinstance(value, type):
        return function_name(value)
    return _repr.repr(value)


def summarize(fn: Callable | FunctionRef, args: tuple = (), kwargs: dict | None = None) -> str:
    """A short readable call summary for logs and Flower, e.g. ``train(0.1, epochs=3)``.

    Never shows pickled bytes; tensors show as their shape and dtype.
    """
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in (kwargs or {}).items()]
    text = f"{function_name(fn)}({', '.join(parts)})"
    return text if len(text) <= _SUMMARY_LIMIT else text[: _SUMMARY_LIMIT - 3] + "..."


_LIBRARY_DIRS = tuple(
    str(Path(p).resolve()) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)
_by_value: set[str] = set()  # modules already looked at (registered by value or not)


def _pickle_user_module_by_value(fn: Callable) -> None:
    """Send functions from the user's own (non-installed) modules by value.

    cloudpickle pickles ``__main__`` by value already; a function imported from
    ``my_experiment.py`` would otherwise travel as a reference the worker
    cannot import.
    """
    mod_name = getattr(fn, "__module__", None)
    if not mod_name or mod_name in _by_value or mod_name == "__main__" or mod_name.startswith("gpulayer"):
        return
    module = sys.modules.get(mod_name)
    if module is None:
        return
    _by_value.add(mod_name)  # looked at once: every submit.s(fn, ...) passes here
    path = getattr(module, "__file__", None)
    if path is None:
        return
    if not str(Path(path).resolve()).startswith(_LIBRARY_DIRS):
        cloudpickle.register_pickle_by_value(module)
