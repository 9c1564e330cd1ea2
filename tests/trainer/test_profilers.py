"""``Trainer(profiler=...)``: what is recorded, under Lightning's action names, and nothing wrapped without one."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from gpulayer.trainer import Callback, Trainer
from gpulayer.trainer.demos.boring_classes import BoringDataModule, BoringModel
from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.profilers import (AdvancedProfiler, PassThroughProfiler, Profiler, PyTorchProfiler,
                                        SimpleProfiler)
from gpulayer.trainer.profilers.pytorch import RegisterRecordFunction, warning_cache
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
        Trainer(profiler="xla", **QUIET)
    assert isinstance(Trainer(profiler="PyTorch", **QUIET).profiler, PyTorchProfiler)
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


# -- PyTorchProfiler --------------------------------------------------------------------------


class Stacked(BoringModel):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_pytorch_profiler_fit_writes_summary_and_traces_per_stage(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="perf")
    trainer = Trainer(max_epochs=1, limit_train_batches=6, limit_val_batches=5, num_sanity_val_steps=0,
                      profiler=profiler, **QUIET)
    trainer.fit(Stacked())
    names = {e.name for e in profiler.function_events}
    assert "[pl][profile][Strategy]SingleDeviceStrategy.validation_step" in names  # the last cycle: validation's
    assert "[pl][module]torch.nn.modules.linear.Linear: layer.0" in names
    assert "[pl][module]torch.nn.modules.container.Sequential: layer" in names
    summary = (tmp_path / "fit-perf.txt").read_text()
    assert summary.startswith("FIT Profiler Report") and "Self CPU" in summary
    traces = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".pt.trace.json"))
    # one cycle per kind of step: the training steps and the validation steps each have their trace
    assert [t.split(".pt")[0].rsplit(".", 1)[0] for t in traces] == [
        "fit-perf-[Strategy]SingleDeviceStrategy.training_step",
        "fit-perf-[Strategy]SingleDeviceStrategy.validation_step"]
    assert profiler.profiler is None and profiler._output_file is None  # torn down after the stage


def test_pytorch_profiler_records_a_short_stage_whole_and_says_so(tmp_path):
    warning_cache.clear()
    trainer = Trainer(default_root_dir=tmp_path, limit_test_batches=3, profiler="pytorch", **QUIET)
    with pytest.warns(UserWarning, match="not enough steps to properly record traces"):
        trainer.test(BoringModel())
    steps = [e for e in trainer.profiler.function_events
             if e.name == "[pl][profile][Strategy]SingleDeviceStrategy.test_step"]
    assert len(steps) == 2  # the schedule is replaced when the first step ends: the steps after it are recorded
    assert any(p.name.startswith("test-[Strategy]") for p in tmp_path.iterdir())  # no filename: stage-action
    warning_cache.clear()


def test_register_record_function_names_each_submodule_and_removes_its_hooks():
    profiler = PyTorchProfiler(schedule=None, export_to_chrome=False)
    model = Stacked()
    with profiler.profile("forward"), RegisterRecordFunction(model):
        model(torch.randn(2, 32))
    profiler.summary()
    names = [e.name for e in profiler.function_events]
    assert "[pl][profile]forward" in names
    assert "[pl][module]torch.nn.modules.activation.ReLU: layer.1" in names
    assert not model.layer[0]._forward_pre_hooks and not model.layer[0]._forward_hooks


def test_record_module_names_false_records_no_module(tmp_path):
    profiler = PyTorchProfiler(schedule=None, record_module_names=False)
    trainer = Trainer(default_root_dir=tmp_path, limit_test_batches=2, profiler=profiler, **QUIET)
    trainer.test(Stacked())
    assert not [e for e in profiler.function_events if e.name.startswith("[pl][module]")]


def test_pytorch_profiler_bad_arguments_get_lightnings_messages():
    with pytest.raises(MisconfigurationException, match="Found sort_by_key: wall. Should be within"):
        PyTorchProfiler(sort_by_key="wall")
    with pytest.raises(MisconfigurationException, match="Schedule should be a callable"):
        PyTorchProfiler(schedule=3)
    with pytest.raises(MisconfigurationException, match="Schedule should return a `torch.profiler.ProfilerAction`"):
        PyTorchProfiler(schedule=lambda step: "record")
    with pytest.raises(KeyError, match="row_limit. This is already a positional argument"):
        PyTorchProfiler(table_kwargs={"row_limit": 3})
    with pytest.raises(KeyError, match="Found invalid table_kwargs key: width. Should be within"):
        PyTorchProfiler(table_kwargs={"width": 3})


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_emit_nvtx_is_refused_without_cuda_when_the_stage_starts():
    profiler = PyTorchProfiler(emit_nvtx=True)  # a config may be built on a laptop for a GPU cluster
    with pytest.raises(MisconfigurationException, match="CUDA is not available here"):
        profiler.start("a")


def test_pytorch_profiler_summary_sorts_and_limits_rows(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="perf", schedule=None, row_limit=2, sort_by_key="count")
    with profiler.profile("a"):
        for _ in range(3):
            torch.ones(4) + torch.zeros(4)
    profiler.describe()
    table = (tmp_path / "perf.txt").read_text()
    body = [line for line in table.splitlines() if line.strip().startswith(("aten::", "[pl]"))]
    assert len(body) == 2 and "Profile stats for: records" in table
    assert profiler.summary() == table  # the events stay readable after the stage


def test_pytorch_profiler_survives_copy_and_pickling():
    import copy
    import pickle

    profiler = PyTorchProfiler(schedule=None)
    profiler.start("x")
    torch.ones(2)
    profiler.describe()
    assert copy.deepcopy(profiler).function_events is not None
    assert pickle.loads(pickle.dumps(PyTorchProfiler(schedule=None)))._recording_map == {}


def test_simple_summary_is_lightnings_table_largest_share_first():
    profiler = SimpleProfiler()
    profiler.setup(stage="fit")
    profiler.recorded_durations.update({"quick": [0.001, 0.001], "slow": [0.5]})
    lines = profiler.summary().expandtabs().splitlines()
    assert lines[0] == "FIT Profiler Report" and lines[1] == ""
    assert [c.strip() for c in lines[3].split("|")[1:-1]] == [
        "Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %"]
    assert [line.split("|")[1].strip() for line in lines if line.startswith("|")] == ["Action", "Total", "slow", "quick"]
    profiler.extended = False
    assert [line.split("|")[3].strip() for line in profiler.summary().expandtabs().splitlines()
            if line.startswith("|  quick")] == ["0.002"]
