"""Lightning's path ``lightning.pytorch.core.module``."""

from gpulayer.trainer.module import LightningModule

__all__ = ["LightningModule"]
