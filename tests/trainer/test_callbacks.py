"""EarlyStopping, LearningRateMonitor and the CSV logger."""

from __future__ import annotations

import csv

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import CSVLogger, EarlyStopping, LearningRateMonitor, Module, Trainer


class Scripted(Module):
    """Logs a scripted validation metric per epoch."""

    def __init__(self, values):
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.values = values

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("score", self.values[min(self.current_epoch, len(self.values) - 1)])

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


def _loader(n=32):
    return DataLoader(TensorDataset(torch.randn(n, 3)), batch_size=8)


def test_early_stopping_stops_after_patience_without_improvement():
    es = EarlyStopping(monitor="score", mode="min", patience=2, min_delta=0.01)
    trainer = Trainer(max_epochs=20, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      callbacks=[es])
    trainer.fit(Scripted([1.0, 0.5, 0.495, 0.6, 0.4]), _loader(), _loader())
    # best 0.5 at epoch 1; 0.495 is within min_delta, 0.6 worse: stops after epoch 3
    assert trainer.should_stop and es.stopped_epoch == 3 and trainer.current_epoch == 4
    assert es.best_score == 0.5


def test_early_stopping_in_max_mode_keeps_going_while_improving():
    es = EarlyStopping(monitor="score", mode="max", patience=1)
    trainer = Trainer(max_epochs=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      callbacks=[es])
    trainer.fit(Scripted([1.0, 2.0, 3.0, 4.0]), _loader(), _loader())
    assert not trainer.should_stop and trainer.current_epoch == 4


def test_csv_logger_writes_metrics_at_log_intervals_and_epoch_ends(tmp_path):
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, log_every_n_steps=2, enable_checkpointing=False,
                      enable_progress_bar=False, callbacks=[LearningRateMonitor(logging_interval="epoch")])
    trainer.fit(Scripted([1.0, 0.5]), _loader(), _loader())
    path = tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    assert trainer.logger.log_dir == str(path.parent)
    rows = list(csv.DictReader(open(path)))
    train_steps = [int(r["step"]) for r in rows if r.get("train_loss")]
    assert train_steps == [1, 3, 5, 7]  # global steps 2, 4, 6, 8
    assert [float(r["score"]) for r in rows if r.get("score")] == [1.0, 0.5]
    assert [float(r["lr-SGD"]) for r in rows if r.get("lr-SGD")] == [0.1, 0.05]
    assert trainer.logged_metrics["score"] == 0.5


def test_a_second_run_gets_the_next_version(tmp_path):
    for _ in range(2):
        trainer = Trainer(max_steps=1, logger=CSVLogger(tmp_path, name="exp"), enable_checkpointing=False,
                          enable_progress_bar=False)
        trainer.fit(Scripted([1.0]), _loader())
    assert trainer.logger.version == 1
    assert (tmp_path / "exp" / "version_1").is_dir()


def test_progress_bar_draws_materialised_values(capsys):
    trainer = Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=True,
                      log_every_n_steps=1)

    class Bar(Scripted):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("shown", 1.5, prog_bar=True)
            return loss

    trainer.fit(Bar([1.0]), _loader())
    out = capsys.readouterr().out
    assert "Epoch 0: 4/4" in out and "shown=1.5" in out
