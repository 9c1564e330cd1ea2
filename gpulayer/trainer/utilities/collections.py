"""``apply_to_collection``: map a function over the tensors (or other type) nested in lists, tuples and dicts."""

from __future__ import annotations

from typing import Any, Callable


def apply_to_collection(data: Any, dtype: type | tuple, function: Callable, *args: Any, **kwargs: Any) -> Any:
    """``function(x)`` for every ``x`` of type ``dtype`` inside ``data``; the structure is kept."""
    if isinstance(data, dtype):
        return function(data, *args, **kwargs)
    if isinstance(data, dict):
        return type(data)({k: apply_to_collection(v, dtype, function, *args, **kwargs) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(apply_to_collection(v, dtype, function, *args, **kwargs) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_collection(v, dtype, function, *args, **kwargs) for v in data)
    return data
