"""gpulayer.trainer.plugins: precision plugins in a Trainer's run and checkpoint IO plugins behind its files."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer
from gpulayer.trainer.callbacks import ModelCheckpoint
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.plugins import (AsyncCheckpointIO, CheckpointIO, DoublePrecision, HalfPrecision,
                                      MixedPrecision, Precision, TorchCheckpointIO)


def _loader(n: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g)), batch_size=2)


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.step_dtypes: list[torch.dtype] = []
        self.batch_dtypes: list[torch.dtype] = []

    def training_step(self, batch, batch_idx):
        (x,) = batch
        out = self.layer(x)
        self.step_dtypes.append(out.dtype)
        self.batch_dtypes.append(x.dtype)
        return out.float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, **kw) -> Trainer:
    kw = {"default_root_dir": tmp_path, "max_epochs": 1, "logger": False, "enable_checkpointing": False,
          "enable_progress_bar": False, "enable_model_summary": False, "accelerator": "cpu", **kw}
    return Trainer(**kw)


def test_bf16_mixed_autocasts_the_step_on_cpu(tmp_path):
    model = Net()
    trainer = _trainer(tmp_path, precision="bf16-mixed")
    assert isinstance(trainer.precision_plugin, MixedPrecision)
    assert trainer.strategy.precision_plugin is trainer.precision_plugin
    trainer.fit(model, _loader())
    assert set(model.step_dtypes) == {torch.bfloat16}
    assert model.layer.weight.dtype == torch.float32  # mixed: the weights stay float32


def test_fp16_plugin_on_cpu_autocasts_and_scales(tmp_path):
    """A MixedPrecision("16-mixed", "cpu") given as a plugin runs float16 autocast with a CPU GradScaler."""
    model = Net()
    plugin = MixedPrecision("16-mixed", "cpu")
    trainer = _trainer(tmp_path, plugins=[plugin])
    assert trainer.precision_plugin is plugin and plugin.scaler is not None
    before = model.layer.weight.detach().clone()
    trainer.fit(model, _loader())
    assert set(model.step_dtypes) == {torch.float16}
    assert not torch.equal(before, model.layer.weight.detach())  # the scaler stepped
    assert plugin.scaler.get_scale() > 0


def test_double_precision_converts_module_and_batches(tmp_path):
    model = Net()
    trainer = _trainer(tmp_path, precision="64-true")
    assert isinstance(trainer.precision_plugin, DoublePrecision) and trainer.precision == "64-true"
    trainer.fit(model, _loader())
    assert model.layer.weight.dtype == torch.float64
    assert set(model.batch_dtypes) == {torch.float64} and set(model.step_dtypes) == {torch.float64}
    assert torch.get_default_dtype() == torch.float32  # restored after every step


def test_half_precision_creates_configure_model_layers_in_low_dtype(tmp_path):
    class Lazy(Net):
        def configure_model(self):
            self.extra = torch.nn.Linear(2, 2)

    model = Lazy()
    trainer = _trainer(tmp_path, plugins=HalfPrecision("bf16-true"))
    trainer.fit(model, _loader())
    assert model.extra.weight.dtype == torch.bfloat16 and model.layer.weight.dtype == torch.bfloat16


def test_a_custom_plugin_hooks_are_called(tmp_path):
    calls: list[str] = []

    class Recording(Precision):
        def pre_backward(self, tensor, module):
            calls.append("pre_backward")
            return super().pre_backward(tensor, module)

        def optimizer_step(self, optimizer, model, closure, **kwargs):
            calls.append("optimizer_step")
            return super().optimizer_step(optimizer, model, closure, **kwargs)

    _trainer(tmp_path, plugins=[Recording()], max_steps=2).fit(Net(), _loader())
    assert calls == ["optimizer_step", "pre_backward"] * 2


class RecordingIO(CheckpointIO):
    def __init__(self) -> None:
        self.base = TorchCheckpointIO()
        self.calls: list[tuple[str, str]] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.calls.append(("save", os.path.basename(path)))
        self.base.save_checkpoint(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        self.calls.append(("load", os.path.basename(path)))
        return self.base.load_checkpoint(path, weights_only=weights_only)

    def remove_checkpoint(self, path):
        self.calls.append(("remove", os.path.basename(path)))
        self.base.remove_checkpoint(path)


def test_custom_checkpoint_io_saves_removes_and_loads(tmp_path):
    io = RecordingIO()
    ck = ModelCheckpoint(dirpath=tmp_path, monitor="step", mode="max", save_top_k=1)
    trainer = _trainer(tmp_path, plugins=[io], callbacks=[ck], enable_checkpointing=True, max_epochs=2,
                       limit_train_batches=1)
    assert trainer.strategy.checkpoint_io is io
    trainer.fit(Net(), _loader())
    assert [c[0] for c in io.calls] == ["save", "save", "remove"]
    trainer.fit(Net(), _loader(), ckpt_path=ck.best_model_path)
    assert io.calls[-1] == ("load", os.path.basename(ck.best_model_path))


class SlowIO(RecordingIO):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.threads: set[str] = set()

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.release.wait(10)
        self.threads.add(threading.current_thread().name)
        super().save_checkpoint(checkpoint, path)


def test_async_checkpoint_io_writes_in_the_background_and_teardown_waits(tmp_path):
    base = SlowIO()
    io = AsyncCheckpointIO(base)
    weights = torch.zeros(3)
    io.save_checkpoint({"w": weights}, str(tmp_path / "a.ckpt"))
    weights.add_(1.0)  # after the call returns: the snapshot keeps the old value
    assert not (tmp_path / "a.ckpt").exists()  # still waiting in the writer thread
    base.release.set()
    io.teardown()
    assert (tmp_path / "a.ckpt").exists()
    assert threading.current_thread().name not in base.threads
    assert torch.equal(torch.load(tmp_path / "a.ckpt")["w"], torch.zeros(3))


def test_async_checkpoint_io_in_a_trainer_gets_the_default_writer(tmp_path):
    io = AsyncCheckpointIO()
    trainer = _trainer(tmp_path, plugins=[io], enable_checkpointing=True, max_epochs=1, limit_train_batches=2)
    assert isinstance(trainer.strategy.checkpoint_io.checkpoint_io, TorchCheckpointIO)
    trainer.fit(Net(), _loader())
    assert list((tmp_path / "checkpoints").glob("*.ckpt")) or list(tmp_path.rglob("*.ckpt"))


def test_a_bad_plugin_is_refused_with_lightnings_message(tmp_path):
    with pytest.raises(MisconfigurationException, match="Found invalid type for plugin"):
        _trainer(tmp_path, plugins=[object()])
    with pytest.raises(MisconfigurationException, match="Received multiple values for Precision"):
        _trainer(tmp_path, plugins=[DoublePrecision(), Precision()])
    with pytest.raises(ValueError, match="Received both `precision=64-true`"):
        _trainer(tmp_path, precision="64-true", plugins=[DoublePrecision()])
