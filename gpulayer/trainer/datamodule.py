"""``LightningDataModule`` (its code lives at Lightning's path, ``core/datamodule.py``)."""

from gpulayer.trainer.core.datamodule import LightningDataModule

__all__ = ["LightningDataModule"]
