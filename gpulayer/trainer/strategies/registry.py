"""``StrategyRegistry``: Lightning's registry of strategy names, each a class and the arguments it is built with.

``StrategyRegistry.register("ddp_custom_io", DDPStrategy, description="...", checkpoint_io=MyIO())`` makes
``Trainer(strategy="ddp_custom_io")`` build ``DDPStrategy(checkpoint_io=MyIO())``. gpulayer's own names
(``"ddp"``, ``"fsdp"``, ...) are listed too; the Trainer resolves those itself (``config.py``) and asks the
registry only for the names it does not know.
"""

from __future__ import annotations

from typing import Any


class _StrategyRegistry(dict):
    """A ``dict`` of name -> ``{"strategy": cls, "init_params": {...}, "description": str, "strategy_name": name}``."""

    def register(self, name: str, strategy: Any = None, description: str | None = None, override: bool = False,
                 **init_params: Any) -> Any:
        """Register ``strategy`` under ``name`` (or, without ``strategy``, return a class decorator that does)."""
        if not isinstance(name, str):
            raise TypeError(f"`name` for {strategy} must be a str, found {name}")
        if name in self and not override:
            raise ValueError(f"'{name}' is already present in the registry. HINT: Use `override=True`.")
        data: dict[str, Any] = {"description": description or "", "init_params": init_params}

        def do_register(cls: Any) -> Any:
            data["strategy"], data["strategy_name"] = cls, name
            self[name] = data
            return cls

        return do_register(strategy) if strategy is not None else do_register

    def get(self, name: str, default: Any = None) -> Any:
        """A new strategy object for ``name``, built with its registered arguments."""
        if name in self:
            data = self[name]
            return data["strategy"](**data["init_params"])
        if default is not None:
            return default
        raise KeyError(f"Invalid strategy name {name!r}. Available strategies: {', '.join(self.available_strategies())}")

    def remove(self, name: str) -> None:
        self.pop(name)

    def available_strategies(self) -> list[str]:
        return list(self.keys())

    def __str__(self) -> str:
        return "Registered Strategies: {}".format(", ".join(self.keys()))


def _builtins() -> _StrategyRegistry:
    from gpulayer.trainer.strategies.fsdp import FSDPStrategy, ModelParallelStrategy
    from gpulayer.trainer.strategies.strategy import DDPStrategy, SingleDeviceStrategy
    registry = _StrategyRegistry()
    registry.register("single_device", SingleDeviceStrategy, description="one process, one device")
    registry.register("ddp", DDPStrategy, description="data parallel in one process per device")
    for unused in (False, True):
        registry.register(f"ddp_find_unused_parameters_{str(unused).lower()}", DDPStrategy,
                          description=f"DDP with find_unused_parameters={unused}", find_unused_parameters=unused)
    registry.register("fsdp", FSDPStrategy, description="FSDP2: parameters, gradients and optimizer states sharded")
    registry.register("model_parallel", ModelParallelStrategy,
                      description="the module parallelizes itself in configure_model on a 2-D device mesh")
    return registry


StrategyRegistry = _builtins()
