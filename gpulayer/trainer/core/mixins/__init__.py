"""Lightning's path ``lightning.pytorch.core.mixins``."""

from gpulayer.trainer.core.mixins.hparams_mixin import HyperparametersMixin

__all__ = ["HyperparametersMixin"]
