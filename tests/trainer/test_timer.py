"""``Timer`` and ``Trainer(max_time=...)``: durations, stopping at the limit (at fit start, per step or per
epoch), ``min_steps`` / ``min_epochs`` winning over it, per-stage times and a resumed fit counting the time
already spent. Compared with Lightning where the outcome does not depend on the clock."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
import torch
from torch import nn

from gpulayer.trainer import Trainer
from gpulayer.trainer.callbacks import Timer
from gpulayer.trainer.errors import MisconfigurationException
from tests.trainer.twin import QUIET, both, gpulayer_ns, loader


def timer_cls(L):
    root = {"gpulayer": "gpulayer.trainer", "lightning": "lightning.pytorch"}[L.name]
    return importlib.import_module(f"{root}.callbacks.timer").Timer


def net(L):
    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("v", self.layer(batch[0]).sum())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net()


@pytest.mark.parametrize(("duration", "seconds"), [
    ("01:02:03:04", 93784.0), (timedelta(minutes=2), 120.0), ({"hours": 1}, 3600.0), (None, None)])
def test_durations_are_read_as_lightning_reads_them(duration, seconds):
    assert both(lambda L: timer_cls(L)(duration=duration).time_remaining()) == seconds


@pytest.mark.parametrize("bad", [{"duration": "6:00:00"}, {"duration": "1 hour"}, {"interval": "batch"}])
def test_bad_durations_and_intervals_are_refused(bad):
    with pytest.raises(MisconfigurationException):
        Timer(**{"duration": timedelta(0), **bad})


@pytest.mark.parametrize(("interval", "kw", "expected"), [
    ("step", {}, (0, 0)),                      # the limit is already reached when the fit starts
    ("epoch", {}, (0, 0)),
    ("step", {"min_steps": 2}, (3, 1)),        # min_steps wins over the limit (and implies min_epochs=1)
    ("step", {"min_epochs": 2}, (6, 2)),
])
def test_a_spent_timer_stops_the_fit_as_soon_as_allowed(interval, kw, expected):
    def run(L):
        trainer = L.Trainer(max_epochs=5, enable_checkpointing=False, callbacks=[timer_cls(L)(timedelta(0), interval)],
                            **kw, **QUIET)
        trainer.fit(net(L), loader(rows=12, batch_size=4))
        return trainer.global_step, trainer.current_epoch

    assert both(run) == expected


def test_max_time_becomes_a_step_timer_and_lifts_the_epoch_default():
    def run(L):
        trainer = L.Trainer(max_time={"seconds": 1337}, **QUIET)
        timers = [c for c in trainer.callbacks if isinstance(c, timer_cls(L))]
        given = timer_cls(L)(duration={"seconds": 5})
        kept = [c for c in L.Trainer(max_time={"seconds": 1}, callbacks=[given], **QUIET).callbacks
                if isinstance(c, timer_cls(L))]
        return [(t._duration, t._interval) for t in timers], kept == [given], trainer.max_steps

    assert both(run) == ([(1337.0, "step")], True, -1)
    assert Trainer(max_time={"seconds": 1}, **QUIET).config.max_epochs == -1


def test_stage_times_and_a_resumed_fit_counting_the_time_spent(tmp_path):
    timer = Timer(duration=timedelta(hours=1))
    trainer = Trainer(max_steps=3, default_root_dir=tmp_path, callbacks=[timer], **{**QUIET, "logger": False})
    trainer.fit(net(gpulayer_ns()), loader(rows=12, batch_size=4), loader(rows=4, batch_size=4))
    spent = timer.time_elapsed("train")
    assert spent > 0 and timer.time_elapsed("validate") > 0 and timer.time_elapsed("test") == 0
    trainer.save_checkpoint(tmp_path / "t.ckpt")

    spent_already = Timer(duration=timedelta(seconds=spent / 2))  # less than was spent: stops before a step
    resumed = Trainer(max_steps=6, callbacks=[spent_already], enable_checkpointing=False, **QUIET)
    resumed.fit(net(gpulayer_ns()), loader(rows=12, batch_size=4), ckpt_path=tmp_path / "t.ckpt")
    assert resumed.global_step == 3 and spent_already._offset >= spent
