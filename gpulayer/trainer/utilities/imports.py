"""Which optional packages are importable (Lightning's ``utilities.imports`` flags, for ported code)."""

from __future__ import annotations

import importlib.util


def _available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


_TORCHVISION_AVAILABLE = _available("torchvision")
_OMEGACONF_AVAILABLE = _available("omegaconf")
_RICH_AVAILABLE = _available("rich")
_JSONARGPARSE_AVAILABLE = _available("jsonargparse")
_TENSORBOARD_AVAILABLE = _available("tensorboard")
