"""Imported by the rewritten Lightning tests (gpulayer side): binds module-level imports one name at a time.

A name gpulayer.trainer lacks becomes a ``Missing`` placeholder: the file still collects, and each test that
touches the name fails with ``ImportError: cannot import name ...``, the cause the runner reports.
"""

import importlib

import lsr_env


# class name -> the ImportError message; the plugin maps a cause that mentions the class back to the message
# (a placeholder used where a type is required, in pytest.warns(...) say, fails with a TypeError naming its class).
REGISTRY = {}


class Missing:
    """Stands for a name gpulayer lacks. Referring to it (``Missing.ATTR``, a parameter list, a base class) still
    works, so the file collects; using it (calling it, testing it, iterating, instantiating a subclass) raises
    the ImportError, so exactly the tests that need the name fail, and with its name."""

    def __init__(self, message):
        object.__setattr__(self, "_lsr_error", message)

    def _fail(self, *args, **kwargs):
        raise ImportError(object.__getattribute__(self, "_lsr_error"))

    __call__ = __bool__ = __iter__ = __len__ = __enter__ = __index__ = __lt__ = __gt__ = _fail
    __eq__ = object.__eq__  # identity: pytest compares and hashes parameters while collecting
    __hash__ = object.__hash__

    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)  # inspection by pytest, copy, pickle: not a use
        return type(self)(object.__getattribute__(self, "_lsr_error"))  # Missing.FITTING: still missing

    def __mro_entries__(self, bases):
        message = object.__getattribute__(self, "_lsr_error")

        class Unavailable:  # a test module's class built on the missing one: fails when instantiated
            def __new__(cls, *args, **kwargs):
                raise ImportError(message)

        return (Unavailable,)

    def __repr__(self):
        return f"<missing: {object.__getattribute__(self, '_lsr_error')}>"


def missing(module, name, error):
    if isinstance(error, ModuleNotFoundError):
        message = f"cannot import name {name!r}: no module {error.name!r}"
    else:
        message = f"cannot import name {name!r} from {module!r}"
    cls = type(f"missing_{name}", (Missing,), {})
    REGISTRY[f"lsr_runtime.{cls.__name__}"] = message
    return cls(message)


def lsr_import(module_name, names):
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        module, module_error = None, error
    values = []
    for name in names:
        if lsr_env.is_fact(name):
            values.append(getattr(lsr_env, name))
            continue
        if module is None:
            values.append(missing(module_name, name, module_error))
            continue
        try:
            values.append(getattr(module, name))
        except AttributeError:
            try:  # a submodule not imported by its package
                values.append(importlib.import_module(f"{module_name}.{name}"))
            except ImportError:
                values.append(missing(module_name, name, None))
    return tuple(values)
