"""Trainer(num_nodes=2, devices=2) as one distributed job on a real fleet: weights back, grad sync, failures."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, RankFailed, Trainer, TrainerConfigError, cluster, seed_everything
from gpulayer.lab.fleet import wait_until
from tests.fleets import running_fleet
from tests.trainer.ddp_order import DDPShardOrder


@pytest.fixture(scope="module")
def trainer_fleet(tmp_path_factory):
    with running_fleet(tmp_path_factory.mktemp("trainer-fleet"), {n: dict(slots=2, zone="eu-1a") for n in ("m1", "m2")}) as f:
        yield f


@pytest.fixture
def fleet(trainer_fleet):
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore

    trainer_fleet.connect()
    yield trainer_fleet
    # the ranks have exited once their slots are free (the hygiene fixture then finds no process left)
    wait_until(lambda: GangStore(redis_client()).held() == {}, 20, "every slot to be free after the test")


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g))


class Linear(Module):
    def __init__(self, batch_size: int = 4):
        super().__init__()
        self.layer = nn.Linear(6, 1)
        self.batch_size = batch_size

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)  # no momentum: the ranks' mean is the full batch's

    def train_dataloader(self):  # built on each rank: the data never travels
        return DataLoader(_dataset(), batch_size=self.batch_size)


def _trainer(**kw) -> Trainer:
    kw = {"accelerator": "cpu", **kw}
    return Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **kw)


def _reference(max_steps: int) -> Linear:
    """One process on the full batch of 16 (4 ranks x 4 samples)."""
    seed_everything(1)
    model = Linear(batch_size=16)
    # the 4 ranks' shuffled shards, step by step (Lightning shuffles every training loader it shards)
    _trainer(max_steps=max_steps).fit(model, DataLoader(_dataset(), batch_size=16, sampler=DDPShardOrder(64, 4, 4, seed=1)))
    return model


def test_two_machines_of_two_processes_match_one_process_on_the_full_batch(fleet):
    seed_everything(1)
    model = Linear(batch_size=4)  # DistributedSampler: each rank 4 of the same 16 samples per step
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _trainer(num_nodes=2, devices=2, max_epochs=1)
    trainer.fit(model)
    assert trainer.global_step == 4 and trainer.current_epoch == 1  # 64 samples / (4 ranks x 4)
    assert not torch.equal(model.layer.weight, before["layer.weight"])  # the caller's model holds the result
    reference = _reference(max_steps=4)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    info = trainer.fit_info
    assert info["grad_sync"] == "two_level" and info["backend"] == "gloo"
    assert (info["world_size"], info["num_nodes"]) == (4, 2)
    assert sorted(info["workers"]) == ["m1", "m2"] and info["placement"]
    assert "loss" in trainer.callback_metrics


def test_flat_grad_sync_keeps_plain_ddp_and_a_small_loader_travels_by_value(fleet):
    seed_everything(1)
    model = Linear()
    trainer = _trainer(num_nodes=2, devices=2, max_steps=2, grad_sync="flat")
    trainer.fit(model, train_dataloaders=DataLoader(_dataset(), batch_size=4))
    assert trainer.fit_info["grad_sync"] == "flat" and trainer.global_step == 2
    for a, b in zip(model.parameters(), _reference(max_steps=2).parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class Rank3Fails(Linear):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 3 and batch_idx == 1:
            raise ValueError("rank three has a bad shard")
        return super().training_step(batch, batch_idx)


def test_a_failing_rank_fails_the_fit_naming_it(fleet):
    trainer = _trainer(num_nodes=2, devices=2, max_epochs=1)
    with pytest.raises(RankFailed) as info:
        trainer.fit(Rank3Fails(), train_dataloaders=lambda: DataLoader(_dataset(), batch_size=4))
    assert info.value.rank == 3
    assert "rank 3" in str(info.value) and "ValueError" in str(info.value) and "bad shard" in str(info.value)
    assert "training_step" in str(info.value)  # the rank's traceback comes along


def test_a_large_loader_object_gets_an_error_with_the_fix(monkeypatch):
    monkeypatch.setattr(cluster, "MAX_LOADER_BYTES", 1024)  # no cluster needed: refused before submission
    trainer = _trainer(num_nodes=2, devices=2, max_epochs=1)
    with pytest.raises(TrainerConfigError, match=r"pickles to .* MiB.*function that builds it.*train_dataloader\(\)"):
        trainer.fit(Linear(), train_dataloaders=DataLoader(_dataset(), batch_size=4))


def test_the_job_asks_for_the_accelerator_and_the_users_resources(monkeypatch):
    from gpulayer import Resources

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the workers' GPUs count, not ours
    cfg = _trainer(num_nodes=2, devices=4, accelerator="cuda", cluster_resources=Resources(zone="eu-1a")).config
    assert cluster._resources(cfg) == Resources(cuda=True, gpus=1, zone="eu-1a")
    cfg = _trainer(num_nodes=2, devices=2, cluster_resources={"region": "eu"}).config
    assert cluster._resources(cfg) == Resources(region="eu")
