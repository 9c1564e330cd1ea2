"""``Trainer(profiler=...)``: what is recorded, under Lightning's action names, and nothing wrapped without one."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from gpulayer.trainer import Callback, Trainer
from gpulayer.trainer.demos.boring_classes import BoringDataModule, BoringModel
from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.profilers import AdvancedProfiler, PassThroughProfiler, Profiler, SimpleProfiler
from tests.trainer.twin import needs_lightning

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


class Hooked(BoringModel):
    def on_train_epoch_start(self):
        pass


class Noted(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass


def test_default_profiler_records_nothing_and_wraps_nothing():
    trainer = Trainer(max_steps=2, callbacks=[Noted()], **QUIET)
    model = Hooked()
    trainer.fit(model)
    assert isinstance(trainer.profiler, PassThroughProfiler)
    hooks = trainer.hooks
    # the module's own bound method, not a wrapper: the fast path is unchanged
    assert hooks.on_train_epoch_start[-1] == model.on_train_epoch_start
    assert trainer.loop.step_fn == model.training_step


def test_simple_profiler_times_hooks_steps_and_fetches_per_call():
    trainer = Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=2, num_sanity_val_steps=0,
                      profiler="simple", callbacks=[Noted()], **QUIET)
    trainer.fit(Hooked())
    trainer.test(Hooked(), dataloaders=BoringModel().val_dataloader())
    durations = trainer.profiler.recorded_durations
    assert isinstance(trainer.profiler, SimpleProfiler)
    counts = {k: len(v) for k, v in durations.items()}
    assert counts["[_TrainingEpochLoop].train_dataloader_next"] == 3  # the limit: no batch fetched past it
    assert counts["[_EvaluationLoop].val_next"] == 2
    assert counts["[_EvaluationLoop].test_next"] == 64
    assert counts["[Strategy]SingleDeviceStrategy.training_step"] == 3
    assert counts["[Callback]Noted.on_train_batch_end"] == 3
    assert counts["[LightningModule]Hooked.on_train_epoch_start"] == 1
    assert counts["run_training_epoch"] == 1
    assert all(d >= 0 for v in durations.values() for d in v)


def _datamodule_keys(L, tmp_path):
    from importlib import import_module

    demos = import_module(f"{L}.demos.boring_classes")
    profilers = import_module(f"{L}.profilers")
    trainer_cls = import_module(L).Trainer

    class DM(demos.BoringDataModule):
        def prepare_data(self):
            pass

        def state_dict(self):
            return {"n": 1}

    trainer = trainer_cls(default_root_dir=tmp_path / L, max_steps=1, limit_val_batches=0, logger=False,
                          enable_progress_bar=False, enable_model_summary=False, profiler=profilers.SimpleProfiler())
    trainer.fit(demos.BoringModel(), datamodule=DM())
    return sorted(k for k in trainer.profiler.recorded_durations if k.startswith("[LightningDataModule]"))


@needs_lightning
def test_datamodule_hooks_have_lightnings_names(tmp_path):
    ours = _datamodule_keys("gpulayer.trainer", tmp_path)
    assert ours == _datamodule_keys("lightning.pytorch", tmp_path)
    assert "[LightningDataModule]DM.state_dict" in ours


def test_start_and_stop_must_pair():
    profiler = SimpleProfiler()
    profiler.start("a")
    with pytest.raises(ValueError, match="already started"):
        profiler.start("a")
    profiler.stop("a")
    with pytest.raises(ValueError, match="never started"):
        profiler.stop("a")
    with profiler.profile("b"):
        pass
    assert len(profiler.recorded_durations["a"]) == len(profiler.recorded_durations["b"]) == 1
    assert "Mean duration" in profiler.summary()


def test_summary_file_per_stage(tmp_path):
    trainer = Trainer(max_steps=2, limit_val_batches=0, profiler=SimpleProfiler(dirpath=tmp_path, filename="perf"),
                      **QUIET)
    trainer.fit(BoringModel())
    text = (tmp_path / "fit-perf.txt").read_text()
    assert "FIT Profiler Report" in text and "[Strategy]SingleDeviceStrategy.training_step" in text


def test_advanced_profiler_reports_functions_per_action(caplog):
    trainer = Trainer(max_steps=2, limit_val_batches=0, profiler="advanced", **QUIET)
    with caplog.at_level(logging.INFO):
        trainer.fit(BoringModel())
    assert isinstance(trainer.profiler, AdvancedProfiler)
    assert "Profile stats for: [Strategy]SingleDeviceStrategy.training_step" in caplog.text
    assert "cumulative" in caplog.text


def test_report_goes_to_stdout_when_logging_is_not_set_up(capsys, monkeypatch):
    from gpulayer.trainer.profilers import profiler as profiler_module

    monkeypatch.setattr(profiler_module.log, "hasHandlers", lambda: False)
    profiler = SimpleProfiler()
    with profiler.profile("x"):
        pass
    profiler.describe()
    assert "Profiler Report" in capsys.readouterr().out


def test_dumped_stats_files_have_safe_names(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, dump_stats=True)
    with profiler.profile("val/loss:best"):
        pass
    profiler.describe()
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".prof"] == ["val_loss_best.prof"]


def test_profiler_choices():
    with pytest.raises(TrainerConfigError, match="can only be one of"):
        Trainer(profiler="fast", **QUIET)
    with pytest.raises(TrainerConfigError, match="not supported by gpulayer"):
        Trainer(profiler="pytorch", **QUIET)
    with pytest.raises(TrainerConfigError, match="Only None, str and subclasses of `Profiler`"):
        Trainer(profiler=object(), **QUIET)

    class Mine(Profiler):
        def __init__(self):
            super().__init__()
            self.seen = []

        def start(self, action_name):
            self.seen.append(action_name)

        def stop(self, action_name):
            pass

    mine = Mine()
    Trainer(max_steps=1, limit_val_batches=0, profiler=mine, **QUIET).fit(BoringModel(), datamodule=None)
    assert "[Strategy]SingleDeviceStrategy.training_step" in mine.seen
    assert os.path.basename(mine._prepare_filename()) == "fit.txt"


def test_profiler_survives_pickling_for_the_ranks():
    import pickle

    profiler = AdvancedProfiler()
    with profiler.profile("x"):
        torch.zeros(1)
    copy = pickle.loads(pickle.dumps(profiler))
    assert copy.profiled_actions == {}


def test_datamodule_state_load_is_recorded_on_resume(tmp_path):
    class DM(BoringDataModule):
        def state_dict(self):
            return {"n": 1}

    kw = dict(default_root_dir=tmp_path, limit_val_batches=0, logger=False, enable_progress_bar=False,
              enable_model_summary=False, profiler="simple")
    trainer = Trainer(max_steps=1, **kw)
    trainer.fit(BoringModel(), datamodule=DM())
    path = trainer.checkpoint_callback.best_model_path
    trainer = Trainer(max_steps=2, **kw)
    trainer.fit(BoringModel(), datamodule=DM(), ckpt_path=path)
    assert len(trainer.profiler.recorded_durations["[LightningDataModule]DM.load_state_dict"]) == 1
