"""Where a tuned value lives: an attribute of the model, its ``hparams``, the datamodule or its ``hparams``."""

from __future__ import annotations

from typing import Any


def holders(model: Any, datamodule: Any, name: str) -> list[tuple[Any, bool]]:
    """Every ``(object, is_mapping)`` that holds ``name``, in Lightning's lookup order."""
    found = []
    for obj in (model, datamodule):
        if obj is None:
            continue
        if name in getattr(obj, "__dict__", {}) or hasattr(type(obj), name):
            found.append((obj, False))
        hparams = getattr(obj, "hparams", None) if _has_hparams(obj) else None
        if isinstance(hparams, dict) and name in hparams:
            found.append((hparams, True))
        elif hparams is not None and not isinstance(hparams, dict) and hasattr(hparams, name):
            found.append((hparams, False))
    return found


def _has_hparams(obj: Any) -> bool:
    try:
        return getattr(obj, "hparams", None) is not None
    except Exception:  # an hparams property that fails before save_hyperparameters
        return False


def get(model: Any, datamodule: Any, name: str) -> Any:
    obj, mapping = holders(model, datamodule, name)[0]
    return obj[name] if mapping else getattr(obj, name)


def put(model: Any, datamodule: Any, name: str, value: Any) -> None:
    """Set ``name`` everywhere it is held, so the model and its data agree."""
    for obj, mapping in holders(model, datamodule, name):
        if mapping:
            obj[name] = value
        else:
            setattr(obj, name, value)
