"""Lightning's path ``lightning.pytorch.core.datamodule``."""

from gpulayer.trainer.datamodule import LightningDataModule

__all__ = ["LightningDataModule"]
