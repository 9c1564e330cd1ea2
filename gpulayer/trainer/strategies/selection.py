"""Which strategy a Trainer's configuration asks for in this process."""

from __future__ import annotations

import os
from typing import Any

import torch

from gpulayer.trainer.strategies.strategy import DDPStrategy, SingleDeviceStrategy


def strategy_for(config: Any) -> SingleDeviceStrategy:
    """The strategy a ``TrainerConfig`` asks for in this process: DDP in a rank of a multi-process run (rank 0
    of the planned world outside one), else a single device; with the config's precision plugin and checkpoint IO."""
    return adopt_strategy(_strategy_for(config), config)


def adopt_strategy(strategy: SingleDeviceStrategy, config: Any) -> SingleDeviceStrategy:
    """``strategy`` with the config's precision plugin, checkpoint IO, layer sync and cluster environment."""
    strategy.precision_plugin = getattr(config, "precision_plugin", None)
    strategy.checkpoint_io = getattr(config, "checkpoint_io", None)
    if isinstance(strategy, DDPStrategy):
        strategy._layer_sync = getattr(config, "layer_sync", None)
        strategy.cluster_environment = getattr(config, "cluster_environment", None)
    return strategy


def _strategy_for(config: Any) -> SingleDeviceStrategy:
    cuda = config.accelerator == "cuda"
    device = torch.device("cuda", config.device_ids[0] if config.device_ids else 0) if cuda else torch.device("cpu")
    if getattr(config, "sharding", None) is not None:  # FSDP2, also with one device (fsdp.py)
        from gpulayer.trainer.strategies import fsdp
        if cuda and config.device_ids:
            device = torch.device("cuda", config.device_ids[int(os.environ.get("LOCAL_RANK", "0"))])
        return fsdp.strategy_for(config.sharding, config, device if cuda else None)
    if not config.multi_process:
        return SingleDeviceStrategy(device)
    if cuda and config.device_ids:
        device = torch.device("cuda", config.device_ids[int(os.environ.get("LOCAL_RANK", "0"))])
    return DDPStrategy(device if cuda else None, config.grad_sync,
                       find_unused_parameters=config.strategy == "ddp_find_unused_parameters_true",
                       planned_world_size=config.devices * config.num_nodes,
                       process_group_backend=getattr(config, "process_group_backend", None))
