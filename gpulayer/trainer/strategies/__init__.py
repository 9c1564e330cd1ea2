"""Strategies: where the module lives and how ranks agree (``strategy.py``: single device, DDP in a rank;
``fsdp.py``: FSDP2 and tensor parallelism), under the names Lightning users import them by."""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.strategies.selection import strategy_for
from gpulayer.trainer.strategies.strategy import DDPStrategy, SingleDeviceStrategy, Strategy, init_context


def __getattr__(name: str) -> Any:
    """``FSDPStrategy``, ``ModelParallelStrategy`` and ``StrategyRegistry``, loaded on first use."""
    if name in ("FSDPStrategy", "ModelParallelStrategy"):
        from gpulayer.trainer.strategies import fsdp
        return getattr(fsdp, name)
    if name == "StrategyRegistry":
        from gpulayer.trainer.strategies.registry import StrategyRegistry
        return StrategyRegistry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DDPStrategy", "FSDPStrategy", "ModelParallelStrategy", "SingleDeviceStrategy", "Strategy", "StrategyRegistry",
           "init_context", "strategy_for"]
