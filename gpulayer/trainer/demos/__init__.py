"""Demo modules and datasets at Lightning's path (``lightning.pytorch.demos``), written for gpulayer."""

from gpulayer.trainer.demos.boring_classes import BoringDataModule, BoringModel, DemoModel
from gpulayer.trainer.demos.lstm import LightningLSTM, SequenceSampler, SimpleLSTM
from gpulayer.trainer.demos.transformer import LightningTransformer, Transformer, WikiText2

__all__ = [
    "BoringDataModule", "BoringModel", "DemoModel", "LightningLSTM", "LightningTransformer", "SequenceSampler",
    "SimpleLSTM", "Transformer", "WikiText2",
]
