"""``Trainer(barebones=True)``: every feature that costs speed off; asking for one back is an error."""

from __future__ import annotations

import logging

import pytest

from gpulayer.trainer import Trainer
from gpulayer.trainer.demos.boring_classes import BoringModel
from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.profilers import PassThroughProfiler
from tests.trainer.twin import gpulayer_ns, lightning_ns, needs_lightning


def _settings(L):
    t = L.Trainer(barebones=True)
    return (t.barebones, len(t.checkpoint_callbacks), len(t.loggers), t.progress_bar_callback is None,
            t.log_every_n_steps, t.num_sanity_val_steps, bool(t.fast_dev_run), type(t.profiler).__name__)


@needs_lightning
def test_barebones_turns_off_what_lightning_turns_off():
    assert _settings(gpulayer_ns()) == _settings(lightning_ns()) == (True, 0, 0, True, 0, 0, False,
                                                                     "PassThroughProfiler")


def test_barebones_says_what_it_turned_off(caplog):
    with caplog.at_level(logging.INFO):
        trainer = Trainer(barebones=True)
    assert "running in `Trainer(barebones=True)` mode" in caplog.text and " - Profiling" in caplog.text
    assert isinstance(trainer.profiler, PassThroughProfiler) and not trainer._detect_anomaly


@pytest.mark.parametrize("kwargs, match", [
    ({"enable_checkpointing": True}, r"enable_checkpointing=True\)` was passed"),
    ({"logger": True}, r"logger=True\)` was passed"),
    ({"enable_progress_bar": True}, r"enable_progress_bar=True\)` was passed"),
    ({"enable_model_summary": True}, r"enable_model_summary=True\)` was passed"),
    ({"log_every_n_steps": 1}, r"log_every_n_steps=1\)` was passed"),
    ({"num_sanity_val_steps": 1}, r"num_sanity_val_steps=1\)` was passed"),
    ({"fast_dev_run": 1}, r"fast_dev_run=1\)` was passed"),
    ({"detect_anomaly": True}, r"detect_anomaly=True\)` was passed"),
    ({"profiler": "simple"}, r"profiler='simple'\)` was passed"),
])
def test_asking_for_a_feature_back_is_an_error(kwargs, match):
    with pytest.raises(TrainerConfigError, match=match):
        Trainer(barebones=True, **kwargs)
    assert issubclass(TrainerConfigError, ValueError)  # Lightning raises ValueError


def test_explicit_off_values_are_accepted():
    Trainer(barebones=True, logger=False, enable_checkpointing=False, log_every_n_steps=0, fast_dev_run=False)


def test_log_warns_and_records_nothing_but_training_runs(tmp_path):
    class Logs(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("loss", out["loss"])
            return out

    trainer = Trainer(barebones=True, max_steps=3, limit_val_batches=0, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"barebones=True\)` is configured"):
        trainer.fit(Logs())
    assert trainer.global_step == 3 and trainer.callback_metrics == {}
    assert not list(tmp_path.iterdir())  # no checkpoint, no log directory


def test_the_cli_signature_accepts_barebones_and_profiler():
    from gpulayer.trainer.cli_trainer import _trainer

    assert _trainer(barebones=True).barebones
    assert type(_trainer(profiler="simple", logger=False).profiler).__name__ == "SimpleProfiler"
    with pytest.raises(TrainerConfigError, match=r"log_every_n_steps=5\)` was passed"):
        _trainer(barebones=True, log_every_n_steps=5)
