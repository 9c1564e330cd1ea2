"""Demo modules and datasets at Lightning's path (``lightning.pytorch.demos``), written for gpulayer."""

from gpulayer.trainer.demos.boring_classes import BoringDataModule, BoringModel, DemoModel

__all__ = ["BoringDataModule", "BoringModel", "DemoModel"]
