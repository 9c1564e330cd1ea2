"""What every strategy offers a Lightning user: ``tensor_init_context``, ``optimizers`` (picklable),
``lightning_restore_optimizer``, ``DDPStrategy(process_group_backend=...)``, ``StrategyRegistry``, and the
refusal to launch ranks from inside a rank."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer
from gpulayer.trainer.plugins.environments import LightningEnvironment
from gpulayer.trainer.plugins.io import TorchCheckpointIO
from gpulayer.trainer.plugins.precision import HalfPrecision
from gpulayer.trainer.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry


class Net(Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _loader():
    return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)


@pytest.mark.parametrize("empty_init", [None, False, True])
def test_tensor_init_context_gives_the_device_the_precision_dtype_and_optionally_no_init(empty_init, monkeypatch):
    calls = []
    original = torch.Tensor.uniform_
    monkeypatch.setattr(torch.Tensor, "uniform_", lambda t, *a, **k: calls.append(1) or original(t, *a, **k))
    strategy = SingleDeviceStrategy("cpu", precision_plugin=HalfPrecision("16-true"))
    with strategy.tensor_init_context(empty_init=empty_init):
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.dtype == torch.float16 and layer.weight.device.type == "cpu"
    assert bool(calls) is not bool(empty_init)
    trainer = Trainer(accelerator="cpu", precision="16-true")
    with trainer.init_module():
        assert torch.nn.Linear(2, 2).weight.dtype == torch.float16  # Trainer.init_module: the same context


def test_optimizers_set_on_a_strategy_are_wrapped_and_survive_pickling():
    strategy = SingleDeviceStrategy("cpu")
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    strategy.optimizers = [optimizer]
    assert strategy.optimizers == [optimizer] and isinstance(strategy._lightning_optimizers[0], torch.optim.SGD)
    restored = pickle.loads(pickle.dumps(strategy))
    assert isinstance(restored._lightning_optimizers[0], torch.optim.SGD)
    assert restored._lightning_optimizers[0].optimizer is restored.optimizers[0]


class NoOptimizerRestore(SingleDeviceStrategy):
    restored = False

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False

    def load_optimizer_state_dict(self, checkpoint):
        type(self).restored = True


def test_a_strategy_that_restores_optimizers_itself_is_not_asked_to(tmp_path):
    trainer = Trainer(accelerator="cpu", max_steps=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(Net(), _loader())
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    model = Net()
    resumed = Trainer(strategy=NoOptimizerRestore("cpu"), accelerator="cpu", max_steps=3, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    resumed.fit(model, _loader(), ckpt_path=str(tmp_path / "a.ckpt"))
    assert not NoOptimizerRestore.restored and resumed.global_step == 3


def test_the_process_group_backend_asked_for_is_the_ranks():
    assert DDPStrategy()._get_process_group_backend() == "gloo"
    assert DDPStrategy(process_group_backend="mpi").process_group_backend == "mpi"
    trainer = Trainer(strategy=DDPStrategy(process_group_backend="gloo"), accelerator="cpu", devices=2)
    assert trainer.config.process_group_backend == "gloo"
    from gpulayer.trainer.strategies import strategy_for
    assert strategy_for(trainer.config)._get_process_group_backend() == "gloo"


def test_a_registered_name_builds_its_strategy_with_its_arguments():
    io = TorchCheckpointIO()
    name = "ddp_with_own_io_for_this_test"
    StrategyRegistry.register(name, DDPStrategy, description="DDP, own checkpoint IO", checkpoint_io=io)
    try:
        assert StrategyRegistry[name]["init_params"] == {"checkpoint_io": io}
        with pytest.raises(ValueError, match="already present in the registry"):
            StrategyRegistry.register(name, DDPStrategy)
        trainer = Trainer(strategy=name, accelerator="cpu", devices=2)
        assert isinstance(trainer.strategy, DDPStrategy) and trainer.strategy.checkpoint_io is io
    finally:
        StrategyRegistry.remove(name)
    assert "fsdp" in StrategyRegistry and "ddp_find_unused_parameters_true" in StrategyRegistry
    with pytest.raises(KeyError, match="Invalid strategy name"):
        StrategyRegistry.get(name)


class NotLaunching(LightningEnvironment):
    @property
    def creates_processes_externally(self) -> bool:
        return False


def test_a_rank_above_zero_that_would_launch_ranks_itself_is_refused(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    trainer = Trainer(strategy="ddp", accelerator="cpu", devices=2, plugins=[NotLaunching()], logger=False,
                      enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(RuntimeError, match="launch new distributed processes with `local_rank > 0`"):
        trainer.fit(Net(), _loader())
