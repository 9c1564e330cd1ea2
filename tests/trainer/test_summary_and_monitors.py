"""Model summary, LambdaCallback, SpikeDetection, ThroughputMonitor, DeviceStatsMonitor, grad_norm, isolate_rng
and the parsing helpers, each in a real fit on a tiny model."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from gpulayer.trainer import LightningModule, Trainer
from gpulayer.trainer.callbacks import (
    DeviceStatsMonitor, LambdaCallback, ModelSummary, RichModelSummary, RichProgressBar, SpikeDetection,
    ThroughputMonitor,
)
from gpulayer.trainer.demos.boring_classes import BoringModel
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.utilities import grad_norm
from gpulayer.trainer.utilities.model_summary import ModelSummary as Summary
from gpulayer.trainer.utilities.model_summary import get_human_readable_count, summarize
from gpulayer.trainer.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr
from gpulayer.trainer.utilities.seed import isolate_rng
from gpulayer.trainer.utilities.spike import TrainingSpikeException
from gpulayer.trainer.utilities.throughput import Throughput, measure_flops

QUIET = dict(accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False)


class RecordingLogger:
    """A logger with a Logger's methods that keeps what it is sent."""

    def __init__(self, tmp_path) -> None:
        self.save_dir = str(tmp_path)
        self.name, self.version, self.log_dir, self.group_separator = "rec", 0, str(tmp_path), "/"
        self.calls: list[tuple[dict, int]] = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((dict(metrics), step))

    def log_hyperparams(self, *args, **kwargs):
        pass

    def log_graph(self, *args, **kwargs):
        pass

    def save(self):
        pass

    def finalize(self, status):
        pass

    def after_save_checkpoint(self, checkpoint_callback):
        pass


class Nested(LightningModule):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 2)))
        self.head = nn.Linear(2, 1)
        self.scale = nn.Parameter(torch.ones(3))  # belongs to no layer
        self.example_input_array = torch.zeros(5, 4)

    def forward(self, x):
        return self.head(self.block(x))


def test_summary_counts_shapes_flops_and_the_leftover_parameters():
    summary = summarize(Nested(), max_depth=1)
    assert summary.layer_names == ["block", "head"]
    assert summary.param_nums == [4 * 8 + 8 + 8 * 2 + 2, 2 + 1]
    assert summary.in_sizes == [[5, 4], [5, 2]] and summary.out_sizes == [[5, 2], [5, 1]]
    assert summary.total_parameters == sum(summary.param_nums) + 3
    assert summary.total_flops == 2 * 5 * (4 * 8 + 8 * 2 + 2 * 1)  # a multiply and an add per weight per sample
    data = dict(summary._get_summary_data())
    assert data["Name"][-1] == "other params" and data["Params"][-1] == "3  "
    deep = Summary(Nested(), max_depth=-1)
    assert deep.layer_names == ["block", "block.0", "block.1", "block.2", "block.2.0", "head"]
    text = str(summary)
    assert "Total estimated model params size (MB)" in text and text.splitlines()[0].startswith("  | Name")
    with pytest.raises(ValueError, match="`max_depth` can be -1, 0 or > 0, got x"):
        summarize(Nested(), max_depth="x")


def test_human_readable_count_units():
    assert [get_human_readable_count(n) for n in (0, 999, 1234, 2e6, 3e9, 4e14, 5e15)] == [
        "0  ", "999  ", "1.2 K", "2.0 M", "3.0 B", "400 T", "5,000 T"]


def test_fit_shows_the_summary_once_and_a_custom_summarize_receives_the_columns(tmp_path, capsys, caplog):
    with caplog.at_level(logging.INFO):
        Trainer(default_root_dir=tmp_path, max_steps=1, logger=False, **QUIET).fit(BoringModel())
    out = capsys.readouterr().out + caplog.text  # printed, or logged when a handler listens (pytest's does)
    assert out.count("Trainable params") == 1 and "| layer | Linear |" in out

    seen = {}

    class Custom(ModelSummary):
        @staticmethod
        def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                      total_flops, **kwargs):
            seen.update(columns=[c for c, _ in summary_data], total=total_parameters, modes=total_training_modes)

    trainer = Trainer(default_root_dir=tmp_path, max_steps=1, logger=False, callbacks=Custom(max_depth=2), **QUIET)
    assert sum(isinstance(c, ModelSummary) for c in trainer.callbacks) == 1
    trainer.fit(BoringModel())
    assert seen == {"columns": [" ", "Name", "Type", "Params", "Mode", "FLOPs"], "total": 66,
                    "modes": {"train": 1, "eval": 0}}
    assert not any(isinstance(c, ModelSummary) for c in Trainer(enable_model_summary=False, **QUIET).callbacks)


def test_summary_is_printed_when_no_logging_handler_would_show_it(capsys, monkeypatch):
    from gpulayer.trainer.callbacks import model_summary

    monkeypatch.setattr(model_summary.log, "hasHandlers", lambda: False)
    summary = summarize(BoringModel())
    ModelSummary.summarize(summary._get_summary_data(), 66, 66, summary.model_size, summary.total_training_modes, 0)
    assert "66        Trainable params" in capsys.readouterr().out


def test_rich_progress_bar_brings_the_rich_summary():
    trainer = Trainer(callbacks=RichProgressBar(), accelerator="cpu")
    assert any(isinstance(c, RichModelSummary) for c in trainer.callbacks)
    assert isinstance(trainer.progress_bar_callback, RichProgressBar)


def test_lambda_callback_calls_each_given_hook_with_the_hooks_arguments(tmp_path):
    seen = []
    cb = LambdaCallback(on_train_epoch_start=lambda t, m: seen.append(("epoch", t.current_epoch)),
                        on_train_batch_end=lambda t, m, out, batch, i: seen.append(("batch", i)),
                        on_fit_end=lambda t, m: seen.append(("end",)), on_validation_start=None)
    Trainer(default_root_dir=tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=0, logger=False,
            callbacks=cb, enable_model_summary=False, **QUIET).fit(BoringModel())
    assert seen == [("epoch", 0), ("batch", 0), ("batch", 1), ("epoch", 1), ("batch", 0), ("batch", 1), ("end",)]
    with pytest.raises(TypeError, match="not Callback hooks"):
        LambdaCallback(on_train_batch_ending=print)

    class Failing(BoringModel):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    errors = []
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(default_root_dir=tmp_path, max_steps=1, logger=False, enable_model_summary=False, **QUIET,
                callbacks=LambdaCallback(on_exception=lambda t, m, err: errors.append(str(err)))).fit(Failing())
    assert errors == ["boom"]


class SpikyLoss(LightningModule):
    """Its loss is 1/(i+1) for batch i, and ``spike`` at batch 4."""

    def __init__(self, spike):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.spike = spike

    def training_step(self, batch, batch_idx):
        value = self.spike if batch_idx == 4 else 1 / (batch_idx + 1)
        return self.w * torch.tensor(float(value))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.parametrize(("spike", "finite_only", "raises"), [
    (10.0, True, True), (float("nan"), True, True), (float("nan"), False, False), (float("-inf"), False, False)])
def test_spike_detection_raises_at_the_spike_and_writes_the_batches_to_skip(tmp_path, spike, finite_only, raises):
    cb = SpikeDetection(exclude_batches_path=str(tmp_path), finite_only=finite_only)
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, logger=False, callbacks=cb, enable_model_summary=False,
                      **QUIET)
    loader = DataLoader(list(range(8)))
    if raises:
        with pytest.raises(TrainingSpikeException, match="Training spike detected in batch 4"):
            trainer.fit(SpikyLoss(spike), loader)
        assert json.loads((tmp_path / "skip_batches.json").read_text()) == [3, 4]
    else:
        trainer.fit(SpikyLoss(spike), loader)
        assert not (tmp_path / "skip_batches.json").exists()


def test_throughput_counts_and_rates():
    tp = Throughput(window_size=2, available_flops=100, separator="|")
    tp.update(time=1.0, batches=1, samples=3, lengths=6, flops=10)
    assert tp.compute() == {"time": 1.0, "batches": 1, "samples": 3, "lengths": 6}
    tp.update(time=3.0, batches=2, samples=6, lengths=12, flops=10)
    assert tp.compute() == {"time": 3.0, "batches": 2, "samples": 6, "lengths": 12, "device|batches_per_sec": 0.5,
                            "device|samples_per_sec": 1.5, "device|items_per_sec": 3.0, "device|flops_per_sec": 5.0,
                            "device|mfu": 0.05}
    with pytest.raises(ValueError, match="greater or equal than batches"):
        tp.update(time=4.0, batches=5, samples=4)
    with torch.device("meta"):
        model, x = nn.Linear(8, 4), torch.randn(2, 8)
    assert measure_flops(model, lambda: model(x)) == 2 * 2 * 8 * 4
    assert measure_flops(model, lambda: model(x), lambda y: y.sum()) > 2 * 2 * 8 * 4


def test_throughput_monitor_logs_per_optimizer_step_with_accumulation(tmp_path):
    logger = RecordingLogger(tmp_path)
    model = BoringModel()
    model.flops_per_batch = 10
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 2, window_size=3)
    Trainer(default_root_dir=tmp_path, logger=logger, callbacks=monitor, max_epochs=1, limit_train_batches=5,
            limit_val_batches=0, accumulate_grad_batches=2, log_every_n_steps=1, enable_model_summary=False,
            **QUIET).fit(model)
    train = [(m, s) for m, s in logger.calls if "train/batches" in m]
    assert [(m["train/batches"], m["train/samples"], s) for m, s in train] == [(2, 4, 0), (4, 8, 1), (5, 10, 2)]
    assert "train/device/flops_per_sec" not in train[0][0] and "train/device/flops_per_sec" in train[1][0]
    assert all(m["epoch"] == 0 for m, _ in train)


def test_throughput_monitor_evaluation_steps_go_on_across_runs(tmp_path):
    logger = RecordingLogger(tmp_path)
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 1, window_size=2)
    trainer = Trainer(default_root_dir=tmp_path, logger=logger, callbacks=monitor, limit_test_batches=4,
                      log_every_n_steps=2, enable_model_summary=False, **QUIET)
    trainer.test(BoringModel(), verbose=False)
    trainer.test(BoringModel(), verbose=False)
    assert [(m["test/batches"], s) for m, s in logger.calls if "test/batches" in m] == [(2, 2), (4, 4), (6, 6), (8, 8)]


def test_device_stats_monitor_logs_cpu_stats_at_batch_hooks(tmp_path):
    logger = RecordingLogger(tmp_path)
    Trainer(default_root_dir=tmp_path, logger=logger, callbacks=DeviceStatsMonitor(), max_epochs=1,
            limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0, log_every_n_steps=1,
            enable_model_summary=False, **QUIET).fit(BoringModel())
    keys = {k for m, _ in logger.calls for k in m}
    for hook in ("on_train_batch_start", "on_train_batch_end", "on_validation_batch_end"):
        assert f"DeviceStatsMonitor.{hook}/cpu_percent" in keys
    assert [s for m, s in logger.calls if "DeviceStatsMonitor.on_train_batch_end/cpu_percent" in m] == [0, 1]
    with pytest.raises(MisconfigurationException, match="Cannot use `DeviceStatsMonitor` callback"):
        Trainer(logger=False, callbacks=DeviceStatsMonitor(), max_steps=1, **QUIET).fit(BoringModel())


def test_grad_norm_per_parameter_and_total():
    layer = nn.Linear(2, 1, bias=False)
    layer.weight.grad = torch.tensor([[3.0, -4.0]])
    norms = grad_norm(layer, norm_type=2)
    assert set(norms) == {"grad_2.0_norm/weight", "grad_2.0_norm_total"}
    assert float(norms["grad_2.0_norm/weight"]) == pytest.approx(5.0)
    assert float(grad_norm(layer, "inf")["grad_inf_norm_total"]) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="positive number or 'inf'"):
        grad_norm(layer, 0)


def test_isolate_rng_puts_every_generator_back():
    torch.manual_seed(3)
    random.seed(3)
    with isolate_rng():
        inside = (torch.rand(2), random.random())
    assert torch.equal(torch.rand(2), inside[0]) and random.random() == inside[1]


def test_lightning_attribute_helpers_find_model_hparams_and_datamodule(tmp_path):
    from gpulayer.trainer import LightningDataModule

    class Model(BoringModel):
        def __init__(self, lr=0.1):
            super().__init__()
            self.save_hyperparameters()

    model = Model()
    assert lightning_hasattr(model, "lr") and lightning_getattr(model, "lr") == 0.1
    lightning_setattr(model, "lr", 0.5)
    assert model.hparams.lr == 0.5
    trainer = Trainer(**QUIET)
    model.trainer = trainer
    trainer.datamodule = LightningDataModule()
    trainer.datamodule.batch_size = 8
    assert lightning_getattr(model, "batch_size") == 8
    with pytest.raises(AttributeError, match="nor the datamodule"):
        lightning_getattr(model, "missing")
