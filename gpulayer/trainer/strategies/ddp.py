"""Lightning's ``strategies.ddp`` module path: ``DDPStrategy`` and the names of the fork-started DDP variants.

gpulayer always starts fresh rank processes (``launcher.py``); the fork/notebook spellings below are the ones
Lightning accepts for a forked start, which ``Trainer(strategy=...)`` does not offer (config.STRATEGIES)."""

from __future__ import annotations

from gpulayer.trainer.strategies.strategy import DDPStrategy

_DDP_FORK_ALIASES = (
    "ddp_fork", "ddp_fork_find_unused_parameters_false", "ddp_fork_find_unused_parameters_true",
    "ddp_notebook", "ddp_notebook_find_unused_parameters_false", "ddp_notebook_find_unused_parameters_true",
)

__all__ = ["DDPStrategy"]
