"""Lightning's path ``lightning.pytorch.core.mixins.hparams_mixin``."""

from gpulayer.trainer.hparams import HyperparametersMixin

__all__ = ["HyperparametersMixin"]
