"""``Fabric`` on one device: a loop the user writes, with a LightningModule or a plain module, giving what
Lightning's Fabric gives; what it cannot do (several devices, strategies) is refused."""

from __future__ import annotations

import importlib.util
from unittest import mock

import pytest
import torch
from torch import nn

from gpulayer.trainer import Fabric, LightningModule
from tests.trainer.twin import loader, needs_lightning


def _fabric_class(root: str):
    return Fabric if root == "gpulayer" else importlib.import_module("lightning.fabric").Fabric


def _module_class(root: str):
    return LightningModule if root == "gpulayer" else importlib.import_module("lightning.pytorch").LightningModule


def _train(root: str, clip: dict) -> list:
    """A hand-written loop over two epochs; the final weights."""
    Fab = _fabric_class(root)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    fabric = Fab(accelerator="cpu", devices=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    data = fabric.setup_dataloaders(loader(rows=16, batch_size=4))
    for _ in range(2):
        for x, y in data:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
            if clip:
                fabric.clip_gradients(model, optimizer, **clip)
            optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


@needs_lightning
@pytest.mark.parametrize("clip", [{}, {"max_norm": 0.1}, {"clip_val": 0.01}], ids=["plain", "norm", "value"])
def test_a_hand_written_loop_gives_lightning_fabrics_weights(clip):
    assert _train("gpulayer", clip) == _train("lightning", clip)


@needs_lightning
def test_a_lightning_module_set_up_with_fabric_logs_to_its_loggers():
    def scenario(root):
        logger = mock.Mock()
        model = _module_class(root)()
        wrapped = _fabric_class(root)(accelerator="cpu", loggers=[logger]).setup(model)
        wrapped.log("a", 1)
        wrapped.log_dict({"b": 0.5, "c": torch.tensor(2.0)})
        wrapped.log("not sent", 3, logger=False)
        with pytest.raises(ValueError, match="`list` values cannot be logged"):
            wrapped.log("bad", [1])
        with pytest.raises(ValueError, match="nested dictionaries cannot be logged"):
            wrapped.log_dict({"nested": {"x": 1}})
        return [(c.kwargs["metrics"], c.kwargs["step"]) for c in logger.log_metrics.call_args_list], \
            wrapped.logger is logger, wrapped.loggers == [logger]

    assert scenario("gpulayer") == scenario("lightning")


@needs_lightning
@pytest.mark.parametrize("algorithm", ["value", "norm"])
def test_clip_gradients_of_a_module_set_up_with_fabric_clips_through_the_fabric(algorithm):
    def scenario(root):
        class Net(_module_class(root)):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)

            def forward(self, x):
                return self.layer(x)

        torch.manual_seed(1)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        wrapped, optimizer = _fabric_class(root)(accelerator="cpu").setup(model, optimizer)
        (wrapped(torch.randn(8, 4)) * 10).sum().backward()
        model.clip_gradients(optimizer, gradient_clip_val=0.05, gradient_clip_algorithm=algorithm)
        return [p.grad.flatten().tolist() for p in model.parameters()], model.optimizers() is optimizer

    assert scenario("gpulayer") == scenario("lightning")


def test_save_and_load_restore_the_module_and_optimizer_in_place(tmp_path):
    fabric = Fabric(accelerator="cpu")
    model, optimizer = fabric.setup(nn.Linear(3, 2), torch.optim.Adam(nn.Linear(3, 2).parameters()))
    fabric.save(tmp_path / "state.pt", {"model": model, "optimizer": optimizer, "step": 7})
    saved = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    rest = fabric.load(tmp_path / "state.pt", {"model": model, "optimizer": optimizer})
    assert rest == {"step": 7} and all(torch.equal(a, b) for a, b in zip(model.parameters(), saved))


@pytest.mark.parametrize("kw", [{"devices": 2}, {"strategy": "ddp"}, {"num_nodes": 2}, {"precision": "8-bit"}])
def test_what_one_device_cannot_do_is_refused(kw):
    with pytest.raises(ValueError, match="Fabric"):
        Fabric(accelerator="cpu", **kw)


def test_self_trainer_of_a_module_set_up_with_fabric_offers_the_fabrics_ranks_only():
    model, fabric = LightningModule(), Fabric(accelerator="cpu")  # the module holds its Fabric weakly
    fabric.setup(model)
    assert model.trainer.global_rank == 0 and model.trainer.world_size == 1
    with pytest.raises(AttributeError, match="`self.trainer.current_epoch` but this attribute is not available"):
        model.trainer.current_epoch
