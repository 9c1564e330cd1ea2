"""``to_torchscript`` and ``to_onnx``: the export answers as the module does, keeps the module's mode, and goes
through the module's batch-transfer hooks; a module that a Trainer has fitted exports too."""

from __future__ import annotations

import importlib.util
import io

import pytest
import torch
from torch import nn

from gpulayer.trainer import LightningModule, Trainer
from gpulayer.trainer.utilities.rank_zero import LightningDeprecationWarning
from tests.trainer.twin import QUIET, loader

needs_onnx = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript")),
    reason="onnx, onnxruntime and onnxscript are not installed")


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 1))
        self.example_input_array = torch.randn(3, 4)

    @property
    def width(self) -> int:  # a user's property compiles (Lightning's only are left out)
        return 8

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Doubling(Net):
    def on_before_batch_transfer(self, batch, dataloader_idx):
        return batch * 2


@pytest.mark.parametrize("method", ["script", "trace"])
def test_torchscript_of_a_fitted_module_answers_as_it_does_in_eval_mode(method, tmp_path):
    model = Net()
    Trainer(max_epochs=1, default_root_dir=tmp_path, **QUIET).fit(model, loader())
    model.train()
    with pytest.warns(LightningDeprecationWarning, match="deprecated in v2.7"):
        script = model.to_torchscript(file_path=tmp_path / "net.pt", method=method)
    assert model.training and not script.training
    x = torch.randn(5, 4)
    model.eval()
    assert torch.allclose(script(x), model(x))
    assert torch.allclose(torch.jit.load(str(tmp_path / "net.pt"))(x), model(x))
    if method == "script":
        assert hasattr(script, "width") and not hasattr(script, "global_step")
        assert not hasattr(script, "training_step")


def test_a_property_the_module_lists_as_unused_is_left_out_of_the_script():
    class Listed(Net):
        __jit_unused_properties__ = ["broken"]

        @property
        def broken(self) -> dict:
            return {"kind": type(self).__mro__}  # Python only: TorchScript cannot compile it

    with pytest.warns(LightningDeprecationWarning):
        script = Listed().to_torchscript()
    assert hasattr(script, "width") and not hasattr(script, "broken")
    assert {"broken", "trainer", "global_step"} <= set(Listed.__jit_unused_properties__)


def test_trace_input_goes_through_the_batch_hooks():
    model = Doubling().eval()
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    x = torch.ones(2, 4)
    with pytest.warns(LightningDeprecationWarning):
        model.to_torchscript(method="trace", example_inputs=x)
    assert torch.equal(seen[0], x * 2)


def test_export_errors_name_the_missing_input():
    model = Net()
    model.example_input_array = None
    with pytest.warns(LightningDeprecationWarning), pytest.raises(ValueError, match="requires either `example_inputs`"):
        model.to_torchscript(method="trace")
    with pytest.warns(LightningDeprecationWarning), pytest.raises(ValueError, match="only supports 'script' or 'trace'"):
        model.to_torchscript(method="compile")


@needs_onnx
def test_onnx_export_runs_in_onnxruntime_with_the_same_answers(tmp_path):
    import onnxruntime

    model = Net()
    Trainer(max_epochs=1, default_root_dir=tmp_path, **QUIET).fit(model, loader())
    model.eval()
    path = tmp_path / "net.onnx"
    model.to_onnx(path)  # example_input_array traces
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 4)
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    assert torch.allclose(torch.from_numpy(out), model(x).detach(), atol=1e-5)

    buffer = io.BytesIO()
    model.train()
    model.to_onnx(buffer, torch.randn(1, 4))
    assert model.training and len(buffer.getvalue()) > 400
