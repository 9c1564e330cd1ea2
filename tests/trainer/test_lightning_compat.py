"""A module written for Lightning runs on gpulayer's Trainer with only its imports changed."""

from __future__ import annotations

import importlib.util
import os
import textwrap

import pytest
import torch

# Written exactly as for Lightning 2.x; only the first lines differ between the two runs.
LIGHTNING_CODE = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class LitRegressor(LightningModule):
        def __init__(self, hidden: int = 16, lr: float = 0.05):
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 1))
            self.epoch_marks = []

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
            self.log_dict({"lr": self.trainer.optimizers[0].param_groups[0]["lr"]}, on_step=True)
            return {"loss": loss}

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

        def on_train_epoch_start(self):
            self.epoch_marks.append(("start", self.current_epoch, self.global_step))

        def on_validation_epoch_end(self):
            self.log("val_marker", float(self.current_epoch))

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 2}}

        def train_dataloader(self):
            g = torch.Generator().manual_seed(0)
            return DataLoader(TensorDataset(torch.randn(96, 4, generator=g), torch.randn(96, 1, generator=g)),
                              batch_size=16)

        def val_dataloader(self):
            g = torch.Generator().manual_seed(1)
            return DataLoader(TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g)),
                              batch_size=16)

    def main(**trainer_kwargs):
        seed_everything(42)
        model = LitRegressor(hidden=16)
        trainer = Trainer(max_epochs=3, enable_progress_bar=False, enable_checkpointing=False, logger=False,
                          **trainer_kwargs)
        trainer.fit(model)
        return model, trainer
''')


def _run(imports: str, **kw):
    namespace: dict = {}
    exec(compile(imports + LIGHTNING_CODE, "<lightning module>", "exec"), namespace)
    return namespace["main"](**kw)


GPULAYER_IMPORTS = "from gpulayer.trainer import LightningModule, Trainer, seed_everything\n"


def test_a_lightning_module_runs_with_changed_imports():
    model, trainer = _run(GPULAYER_IMPORTS)
    assert model.hparams == {"hidden": 16, "lr": 0.05}
    assert trainer.global_step == 18 and trainer.current_epoch == 3
    assert model.epoch_marks == [("start", 0, 0), ("start", 1, 6), ("start", 2, 12)]
    assert {"train_loss", "train_loss_step", "train_loss_epoch", "val_loss", "val_marker", "lr"} <= set(
        trainer.callback_metrics)
    assert float(trainer.callback_metrics["val_marker"]) == 2.0
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**3)  # 9 scheduler steps


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None and not os.environ.get("CI"),
                    reason="lightning is not installed (the test extras install it; required under CI)")
def test_same_results_as_lightning_itself():
    ours, ours_trainer = _run(GPULAYER_IMPORTS)
    theirs, their_trainer = _run("from lightning import LightningModule, Trainer, seed_everything\n",
                                 accelerator="cpu", enable_model_summary=False)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b)
    for key in ("train_loss_epoch", "val_loss", "val_marker"):
        torch.testing.assert_close(torch.as_tensor(ours_trainer.callback_metrics[key]),
                                   their_trainer.callback_metrics[key].float())
    assert ours.epoch_marks == theirs.epoch_marks
