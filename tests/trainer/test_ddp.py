"""devices=M on CPU: M real processes, weights back in the caller, failures named by rank."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, RankFailed, Trainer, TrainerError, seed_everything
from tests.trainer.ddp_order import DDPShardOrder


class Linear(Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(6, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)  # no momentum: halves average to the full batch


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g))


def _fit(devices: int, batch_size: int, **kw) -> tuple[Linear, Trainer]:
    seed_everything(1)
    model = Linear()
    trainer = Trainer(max_epochs=2, devices=devices, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, **kw)
    train = DataLoader(_dataset(), batch_size=batch_size) if devices > 1 else \
        DataLoader(_dataset(), batch_size=batch_size, sampler=DDPShardOrder(64, 2, batch_size // 2, seed=1))
    trainer.fit(model, train, DataLoader(_dataset(), batch_size=16))
    return model, trainer


def test_two_processes_match_one_process_on_the_full_batch():
    single, t1 = _fit(1, 16)
    double, t2 = _fit(2, 8)  # each rank: 8 of the same 16 samples per step (shuffled shards, as Lightning)
    for a, b in zip(single.parameters(), double.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert t2.global_step == t1.global_step == 8 and t2.current_epoch == 2
    assert t2.fit_info["grad_sync"] == "shared_memory"  # the default on one machine's CPU processes
    torch.testing.assert_close(torch.as_tensor(t2.callback_metrics["val_loss"]),
                               torch.as_tensor(t1.callback_metrics["val_loss"]), rtol=1e-5, atol=1e-6)


def test_gloo_all_reduce_on_request_matches_too():
    single, _ = _fit(1, 16)
    double, t2 = _fit(2, 8, grad_sync="flat")
    for a, b in zip(single.parameters(), double.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert t2.fit_info["grad_sync"] == "flat"


def test_ddp_spawn_starts_the_ranks_and_returns_the_trained_weights_to_the_caller():
    # Lightning's ddp_spawn: rank processes train, the calling process gets rank 0's weights and metrics back.
    # gpulayer starts fresh rank processes for "ddp" too, so both names are the same launcher.
    single, t1 = _fit(1, 16)
    spawned, t2 = _fit(2, 8, strategy="ddp_spawn")
    assert t2.fit_info["world_size"] == 2 and t2.fit_info["strategy"] == "ddp"
    for a, b in zip(single.parameters(), spawned.parameters()):  # the caller's own model object holds them
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert t2.global_step == 8 and "val_loss" in t2.callback_metrics


class Boom(Linear):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 2:
            raise ValueError("rank one exploded")
        return super().training_step(batch, batch_idx)


def test_a_failing_rank_surfaces_with_its_traceback_and_no_process_is_left():
    trainer = Trainer(max_epochs=1, devices=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False)
    with pytest.raises(RankFailed) as info:
        trainer.fit(Boom(), DataLoader(_dataset(), batch_size=8))
    assert info.value.rank == 1
    assert "ValueError: rank one exploded" in str(info.value) and "training_step" in str(info.value)
    # the autouse fixture checks that no child process survived


class _Unpicklable:
    def __init__(self):
        import threading
        self.lock = threading.Lock()

    def __iter__(self):
        return iter([])


def test_an_unpicklable_loader_gets_an_error_with_the_fix():
    trainer = Trainer(max_epochs=1, devices=2, accelerator="cpu", logger=False, enable_checkpointing=False)
    with pytest.raises(TrainerError, match="could not be pickled.*function that builds the DataLoader"):
        trainer.fit(Linear(), _Unpicklable())


def test_a_loader_factory_is_built_inside_each_rank():
    seed_everything(1)
    model = Linear()
    trainer = Trainer(max_steps=3, devices=2, accelerator="cpu", logger=False, enable_checkpointing=False)
    trainer.fit(model, lambda: DataLoader(_dataset(), batch_size=8))
    assert trainer.global_step == 3
    assert "loss" in trainer.callback_metrics
