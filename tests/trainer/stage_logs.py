"""A scenario for the loggers across stages: run several stages (fit, validate, test, predict) on one
Trainer with a ``CSVLogger`` and read back what ``metrics.csv`` holds.

Run as a script (``python stage_logs.py PACKAGE DEVICES SEQUENCE ROOT OUT``) because Lightning's
``strategy="ddp"`` starts its other rank by running the script again.
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import sys
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)), batch_size=4)


def _net(L):
    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def _loss(self, batch):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch), sync_dist=True)

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self._loss(batch), sync_dist=True)

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net


def run(package: str, devices: int, sequence: list[str], root: str) -> dict | None:
    """The stages of ``sequence`` on one Trainer of ``package``; what its logger's directory holds
    (None on ranks other than 0)."""
    L = importlib.import_module(package)
    logger = L.loggers.CSVLogger(root, flush_logs_every_n_steps=2)
    kw = dict(strategy="ddp") if devices > 1 else {}
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=devices, logger=logger, log_every_n_steps=2,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, **kw)
    model = _net(L)()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for stage in sequence:
            before = [p.detach().clone() for p in model.parameters()]
            if stage == "fit":
                trainer.fit(model, _loader(), _loader())
            elif stage == "predict":
                trainer.predict(model, _loader())
            else:
                getattr(trainer, stage)(model, _loader(), verbose=False)
    if not trainer.is_global_zero:
        return None
    # a second fit after max_epochs was reached trains no further (Lightning's fit loop is done)
    last_stage_trained = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    path = os.path.join(logger.log_dir, "metrics.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        "log_dir": os.path.relpath(logger.log_dir, root),
        "files": sorted(os.listdir(logger.log_dir)),
        "columns": list(rows[0]) if rows else [],
        # which metrics each row holds, at which step and epoch (values differ with the initial weights)
        "rows": [[r.get("epoch", ""), r["step"], sorted(k for k, v in r.items() if v and k not in ("epoch", "step"))]
                 for r in rows],
        "position": [trainer.global_step, trainer.current_epoch],
        "last_stage_trained": last_stage_trained,
        "deleted_warning": any("will be deleted" in str(w.message) for w in caught),
    }


if __name__ == "__main__":
    package, devices, sequence, root, out = sys.argv[1:6]
    result = run(package, int(devices), sequence.split(","), root)
    if result is not None:
        with open(out, "w") as f:
            json.dump(result, f)
