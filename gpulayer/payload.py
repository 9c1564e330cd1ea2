"""What a job carries: its function (by reference or by value) and a readable summary.

Functions from installed packages travel by reference; the user's own code
(``__main__``, a script's modules, closures, lambdas) travels by value through
cloudpickle, so a worker does not need the user's source tree.
"""

from __future__ import annotations

import collections
import hashlib
import importlib
import io
import os
import pickle
import reprlib
import sys
import sysconfig
import threading
import types
import weakref
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
    seen = _fingerprint(fn)
    if seen is not None:
        hit = _packed.get(fn)
        if hit is not None and hit[0] == seen:
            return hit[1]
    try:
        blob = dumps(fn)
    except Exception as err:
        raise PayloadError(f"cannot pickle function {function_name(fn)}: {type(err).__name__}: {err}; "
                           "it probably captures an open file, lock, socket or similar object: "
                           "create that object inside the function instead") from err
    out = PickledFunction(hashlib.blake2b(blob, digest_size=16).digest(), blob, function_name(fn))
    if seen is not None:
        _packed[fn] = (seen, out)
    return out


def _code_keeping_its_file(code: types.CodeType):
    """cloudpickle's reduction of a code object, with the file it was compiled from in place of its marker.

    cloudpickle sends every code object as from ``<dynamic-code>`` (its payloads stay the same wherever the
    source lives); a traceback from a worker would then read ``File "<dynamic-code>", line 12, in bad``.
    The line numbers travel as they are, so only the file name is put back among the constructor's
    arguments: the pickle is cloudpickle's own, as cheap, and any worker loads it.
    """
    rebuild, args = _CLOUDPICKLE_CODE(code)
    return rebuild, tuple(code.co_filename if type(a) is str and a == _MARKER else a for a in args)


_MARKER = "<dynamic-code>"  # the file name cloudpickle gives code sent by value (tests/test_errors.py notices a change)
_CLOUDPICKLE_CODE = cloudpickle.Pickler.dispatch_table[types.CodeType]


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, keeping the file name of the code it sends by value (tracebacks name it)."""

    dispatch_table = collections.ChainMap({types.CodeType: _code_keeping_its_file},
                                          *cloudpickle.Pickler.dispatch_table.maps)  # (flat: one lookup per map)


def dumps(obj, protocol: int | None = None) -> bytes:
    """``cloudpickle.dumps`` that keeps where functions sent by value were written (``_code_keeping_its_file``).

    A payload of plain values only (numbers, strings, bytes, None, packed functions, in tuples, lists and dicts:
    a tiny job's ``(fn, i)``) pickles the same with Python's own pickler, about twice as fast as cloudpickle's,
    whose every object goes through Python code."""
    if _plain(obj, 3):
        return pickle.dumps(obj, protocol)
    buf = io.BytesIO()
    _Pickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


_PLAIN_MAX = 64  # items a payload may hold and still be checked for the plain pickler


def _plain(obj, depth: int) -> bool:
    """Is ``obj`` made of values that pickle alike with cloudpickle and with Python's pickler (and few of them)?"""
    kind = type(obj)
    if kind in _SCALARS or kind is PickledFunction:
        return True
    if depth <= 0:
        return False
    if kind is tuple or kind is list:
        return len(obj) <= _PLAIN_MAX and all(_plain(item, depth - 1) for item in obj)
    if kind is dict:
        return len(obj) <= _PLAIN_MAX and all(type(k) is str and _plain(v, depth - 1) for k, v in obj.items())
    return False


# A function's pickle, kept while what it was pickled from is unchanged (a loop of submit.delay(fn, i)
# pickles fn once, as Ray's and Dask's remote functions are). Kept only for plain functions whose every
# captured value is immutable or travels by reference (numbers, strings, modules, installed classes,
# other such functions): anything that could change inside without a new binding (a list, a dict, an
# object, a module sent by value) sends the function to cloudpickle again on every call.
_packed: "weakref.WeakKeyDictionary[Callable, tuple[tuple, PickledFunction]]" = weakref.WeakKeyDictionary()
_SCALARS = frozenset({int, float, complex, str, bytes, bool, type(None), type(Ellipsis), range})
_names_of: dict[types.CodeType, tuple[str, ...]] = {}


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """The global names ``code`` and the code nested in it may read."""
    names = _names_of.get(code)
    if names is None:
        found = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                found.update(_global_names(const))
        names = _names_of[code] = tuple(sorted(found))
        if len(_names_of) > 4096:
            _names_of.clear()
    return names


def _by_reference(module_name: str | None) -> bool:
    """Does cloudpickle send what lives in this module as a reference (an installed, importable module)?"""
    if not module_name or module_name == "__main__" or module_name not in sys.modules:
        return False
    registered = cloudpickle.list_registry_pickle_by_value()
    return not any(module_name == m or module_name.startswith(m + ".") for m in registered)


def _frozen(value, depth: int):
    """``value`` itself where its pickle cannot change while it stays the same object, else ``_CHANGING``."""
    kind = type(value)
    if kind in _SCALARS or kind is types.BuiltinFunctionType:
        return value
    if kind is tuple or kind is frozenset:
        parts = tuple(_frozen(v, depth) for v in value)
        return _CHANGING if _CHANGING in parts else parts
    if kind is types.ModuleType:
        return value if _by_reference(value.__name__) else _CHANGING
    if kind is types.FunctionType:
        inner = _fingerprint(value, depth + 1)
        return _CHANGING if inner is None else inner
    if isinstance(value, type):
        return value if value.__module__ == "builtins" or _by_reference(value.__module__) else _CHANGING
    return _CHANGING


_CHANGING = object()
_MISSING = object()


def _fingerprint(fn, depth: int = 0) -> tuple | None:
    """What ``fn``'s pickle is made of, by identity, or None where it cannot be told cheaply (see ``_packed``)."""
    if type(fn) is not types.FunctionType or depth > 3 or fn.__dict__:
        return None
    code, space = fn.__code__, fn.__globals__
    parts = [fn, code, fn.__name__, fn.__qualname__, fn.__module__, fn.__doc__]
    for name in _global_names(code):
        value = space.get(name, _MISSING)
        parts.append(_MISSING if value is _MISSING else _frozen(value, depth))
    for value in (fn.__defaults__ or ()):
        parts.append(_frozen(value, depth))
    for name, value in (fn.__kwdefaults__ or {}).items():
        parts += (name, _frozen(value, depth))
    for cell in (fn.__closure__ or ()):
        try:
            parts.append(_frozen(cell.cell_contents, depth))
        except ValueError:  # a cell not filled yet
            return None
    for name, value in fn.__annotations__.items():
        parts += (name, _frozen(value, depth))
    return None if _CHANGING in parts else tuple(parts)


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


def forget_loaded() -> None:
    """Forget the functions loaded so far (the modules they were loaded against were taken away)."""
    with _loaded_lock:
        _loaded.clear()


def _import_ref(ref: str) -> Callable:
    mod_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise PayloadError(f"cannot load {ref!r} on this worker: {err}; install the package on every "
                           "worker, ship it with working_dir= or py_modules=, or pass the function object "
                           "itself to send it by value") from err
    return obj


def function_name(fn: Callable | FunctionRef) -> str:
    if isinstance(fn, PickledFunction):
        return fn.name
    if isinstance(fn, str):
        return fn.partition(":")[2] or fn
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def job_name(ref: FunctionRef) -> str:
    """The name a job goes by in logs and monitoring (Celery's ``shadow``: Flower's Name column, its filters and
    ``/metrics``): ``train`` for a function sent by value, ``mymod.preprocess`` for ``"mymod:preprocess"``."""
    if isinstance(ref, PickledFunction):
        return ref.name
    return ref.replace(":", ".") if isinstance(ref, str) else function_name(ref)


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


def unsendable_result(result: Any, err: BaseException) -> str:
    """Why a job's return value could not be sent back (``err``: the failed pickling, or the size limit)."""
    root = err  # kombu's EncodeError, around the serializer's PayloadError, around pickle's own error
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__
    kind = type(result)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(root, PayloadError):  # pickled, but over the size limit
        return f"the job's result ({name}) could not be sent back: {root}"
    return (f"the job's result could not be pickled: the function returned a {name}, and "
            f"pickling it failed ({type(root).__name__}: {root}); return plain data instead (numbers, strings, "
            "lists and dicts of them, tensors, arrays) or an object that pickles, or write the result to shared "
            "storage and return its path")


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


def in_library(path: str | os.PathLike) -> bool:
    """Is ``path`` inside this interpreter's standard library or site-packages? What is not is the user's own
    code: shipped with the job (``script_root``) and pickled by value (``payload``, the Trainer's cluster fit)."""
    return str(Path(path).resolve()).startswith(_LIBRARY_DIRS)


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
    if not in_library(path):
        cloudpickle.register_pickle_by_value(module)
