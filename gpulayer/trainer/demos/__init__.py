"""Lightning's demo modules at Lightning's path (``lightning.pytorch.demos``), copied with only imports changed."""

from gpulayer.trainer.demos.boring_classes import BoringDataModule, BoringModel, DemoModel
from gpulayer.trainer.demos.transformer import LightningTransformer, Transformer, WikiText2

__all__ = ["BoringDataModule", "BoringModel", "DemoModel", "LightningTransformer", "Transformer", "WikiText2"]
