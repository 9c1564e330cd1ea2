"""``is_overridden``: does an object replace a hook of its base class (Lightning's ``utilities.model_helpers``)?

The Trainer asks it to decide what to call (``configure_model``, ``on_validation_model_train``, the
datamodule's batch-transfer hooks) and to pick the fast fit loop when nothing changes the step.
"""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock


def _code_of(fn: Any) -> Any:
    """The code object behind ``fn``, seen through ``functools.wraps``, ``partial``, ``Mock(wraps=...)``."""
    if hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    if isinstance(fn, mock.Mock):
        fn = fn._mock_wraps
    elif isinstance(fn, functools.partial):
        fn = fn.func
    if fn is None:
        return None
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", fn)


def trainer_base(obj: object, name: str) -> type | None:
    """gpulayer's base class called ``name`` (``Module``, ``LightningDataModule``, ``Callback``) that ``obj`` (or
    the class ``obj``) derives from; found by name so this module imports none of the classes it serves."""
    cls = obj if isinstance(obj, type) else type(obj)
    return next((c for c in cls.__mro__ if c.__name__ == name and c.__module__.startswith("gpulayer.trainer.")), None)


def _default_parent(instance: object) -> type:
    for name in ("Module", "LightningDataModule", "Callback"):
        parent = trainer_base(instance, name)
        if parent is not None:
            return parent
    raise ValueError(f"Expected a parent: is_overridden(..., {type(instance).__name__}) needs "
                     "parent=<the base class that declares the method>")


def is_overridden(method_name: str, instance: object | None = None, parent: type | None = None) -> bool:
    """True when ``instance`` (a module, datamodule or callback) defines ``method_name`` other than ``parent``'s.

    An attribute set on the object counts (``model.on_train_epoch_end = fn``); ``None`` there means "not defined".

    >>> is_overridden("training_step", model)   # doctest: +SKIP
    True
    """
    if instance is None:
        return False
    if parent is None:
        parent = _default_parent(instance)
    own = getattr(instance, method_name, None)
    if own is None:
        return False
    own_code = _code_of(own)
    if own_code is None:
        return False
    base = getattr(parent, method_name, None)
    if base is None:
        raise ValueError(f"The parent should define the method: {parent.__name__} has no {method_name!r}")
    return own_code != _code_of(base)
