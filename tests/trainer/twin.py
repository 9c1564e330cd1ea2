"""Run one scenario under gpulayer's Trainer and under Lightning 2.6.6, to compare what they do.

A scenario is a function of ``L``, a namespace holding one package's ``LightningModule``,
``Trainer``, callbacks and so on, that builds its classes on ``L``'s base classes, runs, and
returns plain values. ``gpulayer_ns()`` and ``lightning_ns()`` give the two namespaces.
"""

from __future__ import annotations

import importlib.util
import os
import types

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None and not os.environ.get("CI"),
    reason="lightning is not installed (the test extras install it; required under CI)")
QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
NAMES = ("LightningModule", "LightningDataModule", "Trainer", "Callback", "seed_everything")
CALLBACKS = ("EarlyStopping", "ModelCheckpoint")


def _namespace(root: str) -> types.SimpleNamespace:
    pkg = importlib.import_module(root)
    callbacks = importlib.import_module(f"{root}.callbacks")
    ns = types.SimpleNamespace(name=root.split(".")[0], **{n: getattr(pkg, n) for n in NAMES},
                               **{n: getattr(callbacks, n) for n in CALLBACKS})
    ns.BasePredictionWriter = getattr(callbacks, "BasePredictionWriter", None)
    return ns


def gpulayer_ns() -> types.SimpleNamespace:
    return _namespace("gpulayer.trainer")


def lightning_ns() -> types.SimpleNamespace:
    return _namespace("lightning.pytorch")


def both(scenario, *args, **kwargs):
    """The scenario's result under gpulayer; under Lightning too (asserted equal) when it is installed."""
    ours = scenario(gpulayer_ns(), *args, **kwargs)
    if importlib.util.find_spec("lightning") is not None:
        theirs = scenario(lightning_ns(), *args, **kwargs)
        assert ours == theirs, f"gpulayer gave {ours!r}, Lightning 2.6.6 gave {theirs!r}"
    return ours


def loader(rows: int = 16, batch_size: int = 4, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(rows, 4, generator=g), torch.randn(rows, 1, generator=g)),
                      batch_size=batch_size)


def regressor(L):
    """The scenarios' smallest module on ``L``'s base class: a linear layer on ``loader()``'s rows, MSE loss,
    SGD with lr 0.1. Scenarios subclass it and add the hooks they look at."""

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regressor
