"""Hyperparameters and metric names made fit for a logger: a dict from a Namespace, nesting flattened to
``a/b`` keys, values a log file can hold (numbers, strings, bools, tensors; anything else as its ``str``)."""

from __future__ import annotations

import dataclasses
from argparse import Namespace
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch


def convert_params(params: Any) -> dict[str, Any]:
    """``None`` -> ``{}``, a ``Namespace`` -> its ``vars``; a mapping as it is."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        return vars(params)
    return params


def flatten_dict(params: Mapping[Any, Any], delimiter: str = "/", parent_key: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a/b": 1}``; Namespaces and dataclass instances open like dicts, a list of dicts by index;
    keys become strings."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{parent_key}{delimiter}{key}" if parent_key else str(key)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        elif isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, MutableMapping):
            flat.update(flatten_dict(value, delimiter, name))
        elif isinstance(value, list) and value and all(isinstance(v, MutableMapping) for v in value):
            for i, item in enumerate(value):
                flat.update(flatten_dict(item, delimiter, f"{name}{delimiter}{i}"))
        else:
            flat[name] = value
    return flat


def sanitize_params(params: dict[str, Any]) -> dict[str, Any]:
    """Numpy scalars as Python numbers; what is not a bool, int, float, str or tensor as its ``str``."""
    try:
        import numpy as np
        numpy_scalars: tuple = (np.bool_, np.integer, np.floating)
    except ImportError:
        numpy_scalars = ()
    out = {}
    for key, value in params.items():
        if numpy_scalars and isinstance(value, numpy_scalars):
            value = value.item()
        out[key] = value if type(value) in (bool, int, float, str, torch.Tensor) else str(value)
    return out


def add_prefix(metrics: Mapping[str, Any], prefix: str, separator: str) -> Mapping[str, Any]:
    return {f"{prefix}{separator}{k}": v for k, v in metrics.items()} if prefix else metrics


def sanitize_callables(params: Mapping[str, Any]) -> dict[str, Any]:
    """A class as its name; another callable as what it returns when called without arguments (a factory of a
    value), or its name when that fails or gives another callable."""
    def value_of(v: Any) -> Any:
        if isinstance(v, type):
            return v.__name__
        if not callable(v):
            return v
        try:
            out = v()
        except Exception:
            return getattr(v, "__name__", None)
        return getattr(v, "__name__", None) if callable(out) else out

    return {k: value_of(v) for k, v in params.items()}


def json_serializable(params: Mapping[str, Any]) -> dict[str, Any]:
    """Values JSON cannot encode (a ``Path``, an object) as their ``str``; the rest as they are."""
    import json

    def encodable(v: Any) -> bool:
        if v is None or isinstance(v, (bool, int, float, str, list, dict)):
            return True
        try:
            json.dumps(v)
            return True
        except (TypeError, OverflowError, ValueError):
            return False

    return {k: v if encodable(v) else str(v) for k, v in params.items()}
