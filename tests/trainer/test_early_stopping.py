"""EarlyStopping as Lightning documents it: patience, min_delta, mode, thresholds, non-finite values, strictness.

Each scenario feeds the callback a scripted metric, one value per epoch, and is run under both
Trainers (``twin.both``); the expected stops are pinned so the test also checks without Lightning.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.trainer.twin import QUIET, both, loader


def scripted(L, values, *, key="val_loss", in_training=False, max_epochs=None, with_reason=False, **es):
    """Train with EarlyStopping(**es) watching ``key``, whose value at epoch e is ``values[e]``."""

    class Scripted(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            if in_training:
                self.log(key, torch.tensor(values[self.current_epoch]), on_step=False, on_epoch=True)
            return nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            if not in_training:
                self.log(key, torch.tensor(values[self.current_epoch]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    stopper = L.EarlyStopping(monitor=key, **es)
    trainer = L.Trainer(max_epochs=max_epochs or len(values), callbacks=[stopper], enable_checkpointing=False,
                        num_sanity_val_steps=0, **QUIET)
    trainer.fit(Scripted(), loader(), loader(8))
    if with_reason:
        return stopper.stopping_reason.name
    return dict(epochs_run=trainer.current_epoch, stopped_epoch=stopper.stopped_epoch, wait=stopper.wait_count,
                best=round(float(stopper.best_score), 4), stopped=trainer.should_stop)


def test_early_stopping_waits_patience_epochs_without_improvement():
    r = both(scripted, [5.0, 4.0, 3.0, 3.0, 3.5, 3.2, 1.0, 0.5], patience=2)
    assert r == dict(epochs_run=5, stopped_epoch=4, wait=2, best=3.0, stopped=True)


def test_early_stopping_counts_an_improvement_smaller_than_min_delta_as_none():
    r = both(scripted, [5.0, 4.8, 4.6, 4.4, 4.2, 4.0], patience=2, min_delta=0.5)
    assert r["stopped"] and r["stopped_epoch"] == 2 and r["best"] == 5.0


def test_early_stopping_in_max_mode_follows_a_rising_metric():
    r = both(scripted, [0.1, 0.2, 0.3, 0.3, 0.3, 0.9], key="val_acc", mode="max", patience=1)
    assert r == dict(epochs_run=4, stopped_epoch=3, wait=1, best=0.3, stopped=True)


def test_early_stopping_stops_once_the_stopping_threshold_is_reached():
    r = both(scripted, [5.0, 3.0, 0.9, 0.5, 0.1], patience=10, stopping_threshold=1.0)
    assert r["stopped"] and r["stopped_epoch"] == 2


def test_early_stopping_stops_once_the_metric_diverges_past_the_threshold():
    r = both(scripted, [5.0, 4.0, 12.0, 3.0, 2.0], patience=10, divergence_threshold=10.0)
    assert r["stopped"] and r["stopped_epoch"] == 2 and r["best"] == 4.0


def test_early_stopping_stops_on_a_non_finite_metric_unless_told_not_to():
    values = [5.0, 4.0, math.nan, 3.0, 2.0]
    assert both(scripted, values, patience=10)["stopped_epoch"] == 2
    assert both(scripted, values, patience=10, check_finite=False)["stopped"] is False


def test_early_stopping_can_watch_a_training_metric_at_the_training_epoch_end():
    r = both(scripted, [3.0, 2.0, 2.5, 2.5, 2.5, 1.0], key="train_metric", in_training=True, patience=2,
             check_on_train_epoch_end=True)
    assert r["stopped"] and r["stopped_epoch"] == 3 and r["best"] == 2.0



def test_early_stopping_on_a_metric_never_logged_raises_when_strict_and_carries_on_when_not():
    def never_logged(L, strict):
        class Quiet(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

            def validation_step(self, batch, batch_idx):
                self.log("val_other", 1.0)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        trainer = L.Trainer(max_epochs=2, callbacks=[L.EarlyStopping(monitor="val_loss", strict=strict)],
                            enable_checkpointing=False, num_sanity_val_steps=0, **QUIET)
        try:
            trainer.fit(Quiet(), loader(), loader(8))
        except RuntimeError as err:
            return "raised: " + ("names the metric" if "val_loss" in str(err) else str(err))
        return f"ran {trainer.current_epoch} epochs"

    assert both(never_logged, strict=True) == "raised: names the metric"
    assert both(never_logged, strict=False) == "ran 2 epochs"


def test_early_stopping_state_survives_a_checkpoint():
    def state(L):
        stopper = L.EarlyStopping(monitor="val_loss", patience=4)
        trainer = L.Trainer(max_epochs=3, callbacks=[stopper], enable_checkpointing=False, num_sanity_val_steps=0,
                            **QUIET)

        class M(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

            def validation_step(self, batch, batch_idx):
                self.log("val_loss", torch.tensor([3.0, 1.0, 2.0][self.current_epoch]))

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        trainer.fit(M(), loader(), loader(8))
        saved = stopper.state_dict()
        fresh = L.EarlyStopping(monitor="val_loss", patience=4)
        fresh.load_state_dict(saved)
        documented = {"wait_count", "stopped_epoch", "best_score", "patience"}
        return documented <= set(saved), fresh.wait_count, float(fresh.best_score), fresh.patience

    assert both(state) == (True, 1, 1.0, 4)


def test_early_stopping_says_why_it_stopped():
    from gpulayer.trainer.callbacks.early_stopping import EarlyStoppingReason  # noqa: F401

    def reasons(L):
        cases = (([5.0, 5.0, 5.0], dict(patience=1)), ([5.0, 0.5, 0.1], dict(stopping_threshold=1.0)),
                 ([5.0, 50.0, 1.0], dict(divergence_threshold=10.0)), ([5.0, math.nan, 1.0], {}))
        return [scripted(L, values, with_reason=True, **es) for values, es in cases]

    assert both(reasons) == ["PATIENCE_EXHAUSTED", "STOPPING_THRESHOLD", "DIVERGENCE_THRESHOLD", "NON_FINITE_METRIC"]
