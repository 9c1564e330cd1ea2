"""strategy="fsdp" (FSDP2, fully_shard on a device mesh) in real CPU processes over gloo: shards, DDP's losses,
checkpoints that reshard, a full state dict on request, configure_model, Lightning's arguments."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, RankFailed, Trainer, TrainerConfigError, seed_everything
from gpulayer.trainer.callbacks import Callback, ModelCheckpoint
from gpulayer.trainer.checkpoint import META_FILE
from gpulayer.trainer.strategies import FSDPStrategy, ModelParallelStrategy

STEPS = 20


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Net(Module):
    """Every dimension even: each of 2 (or 4) ranks holds exactly its share of every parameter."""

    def __init__(self, lr: float = 1e-2):
        super().__init__()
        self.lr = lr
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.Sequential(Block(32), Block(32))
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)  # a state per parameter: it is sharded too


class SelfSharded(Net):
    """Lightning's ModelParallelStrategy recipe: the module applies fully_shard itself, on self.device_mesh."""

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard
        mesh = self.device_mesh["data_parallel"]
        for block in self.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)


class Record(Callback):
    """Per step, the loss averaged over every rank; at the start, every rank's local parameter bytes."""

    def __init__(self):
        self.losses: list[float] = []
        self.local_bytes: list[int] = []
        self.full_bytes = 0
        self.sharded = False
        self.start_step = 0

    def on_train_start(self, trainer, pl_module):
        from torch.distributed.tensor import DTensor
        self.start_step = trainer.global_step  # > 0: the run resumed
        params = list(pl_module.parameters())
        self.sharded = all(isinstance(p, DTensor) for p in params)
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in params)
        self.full_bytes = sum(p.numel() * p.element_size() for p in params)  # a DTensor's numel is the global one
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        self.local_bytes = gathered

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(trainer.strategy.reduce(loss.detach().float(), "mean")))

    def state_dict(self):
        return {"losses": self.losses, "local_bytes": self.local_bytes, "full_bytes": self.full_bytes,
                "sharded": self.sharded, "start_step": self.start_step}

    def load_state_dict(self, state):
        self.__dict__.update(state)


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g))


def _fit(strategy, devices: int = 2, max_steps: int = STEPS, model: type = None, callbacks=(),
         **kw) -> tuple[Module, Trainer, Record]:
    seed_everything(3)
    model = (model or Net)()  # after the seed: the same initial weights in every run
    record = Record()
    trainer = Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_steps=max_steps, logger=False,
                      enable_checkpointing=bool(callbacks), enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[record, *callbacks], **kw)
    # the same 16 samples per step at any world size: 2 ranks x 8 or 4 ranks x 4 (DistributedSampler's shards)
    trainer.fit(model, lambda: DataLoader(_data(), batch_size=32 // devices // 2))
    return model, trainer, record


@pytest.fixture(scope="module")
def fsdp_run():
    """20 steps on 2 ranks, each Block sharded on its own: the run the other tests compare with."""
    return _fit(FSDPStrategy(auto_wrap_policy={Block}))


def test_each_of_two_ranks_holds_half_of_the_parameters(fsdp_run):
    _, trainer, record = fsdp_run
    assert record.sharded and len(record.local_bytes) == 2
    for local in record.local_bytes:  # every dimension is even: exactly 1/W each
        assert local == record.full_bytes // 2
    assert trainer.fit_info["strategy"] == "fsdp" and trainer.fit_info["mesh"] == (2,)
    assert trainer.fit_info["backend"] == "gloo" and trainer.fit_info["world_size"] == 2


def test_twenty_steps_lose_what_ddp_loses_and_end_on_the_same_weights(fsdp_run):
    ddp_model, _, ddp = _fit("ddp")
    fsdp_model, trainer, fsdp = fsdp_run
    assert len(fsdp.losses) == len(ddp.losses) == STEPS and trainer.global_step == STEPS
    assert ddp.losses[-1] < ddp.losses[0]  # it trained
    torch.testing.assert_close(torch.tensor(fsdp.losses), torch.tensor(ddp.losses), rtol=0, atol=1e-5)
    # the caller's model holds the full trained weights (gathered from the shards at the end of the run)
    for (name, a), b in zip(fsdp_model.state_dict().items(), ddp_model.state_dict().values()):
        assert type(a) is torch.Tensor, name
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_gradient_accumulation_syncs_once_per_step_and_still_matches_ddp():
    _, _, ddp = _fit("ddp", max_steps=6, accumulate_grad_batches=2)
    _, _, fsdp = _fit("fsdp", max_steps=6, accumulate_grad_batches=2)
    torch.testing.assert_close(torch.tensor(fsdp.losses), torch.tensor(ddp.losses), rtol=0, atol=1e-5)


def test_a_sharded_checkpoint_of_two_ranks_resumes_at_four_with_the_uninterrupted_losses(tmp_path, fsdp_run):
    whole = fsdp_run[2]
    saver = ModelCheckpoint(dirpath=str(tmp_path), filename="half", every_n_train_steps=STEPS // 2, save_top_k=-1)
    _fit(FSDPStrategy(state_dict_type="sharded"), devices=2, max_steps=STEPS // 2, callbacks=[saver])
    saved = tmp_path / "half.ckpt"
    assert saved.is_dir() and (saved / META_FILE).is_file() and (saved / ".metadata").is_file()
    assert len([f for f in os.listdir(saved) if f.endswith(".distcp")]) == 2  # one file of shards per rank
    _, trainer, resumed = _fit_resumed(str(saved), devices=4)
    assert trainer.global_step == STEPS and trainer.fit_info["world_size"] == 4
    # the recorder's own state came back from the checkpoint: the first 10 losses, then the resumed run's 10
    assert len(resumed.losses) == STEPS and resumed.local_bytes == [resumed.full_bytes // 4] * 4
    torch.testing.assert_close(torch.tensor(resumed.losses[STEPS // 2:]), torch.tensor(whole.losses[STEPS // 2:]),
                               rtol=0, atol=1e-5)


def _fit_resumed(path: str, devices: int, strategy=None) -> tuple[Module, Trainer, Record]:
    seed_everything(3)
    model, record = Net(), Record()
    trainer = Trainer(strategy=strategy or FSDPStrategy(state_dict_type="sharded"), accelerator="cpu",
                      devices=devices, max_steps=STEPS, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[record])
    trainer.fit(model, lambda: DataLoader(_data(), batch_size=32 // devices // 2), ckpt_path=path)
    return model, trainer, record


def test_a_full_state_dict_is_one_file_written_by_rank_zero_that_any_trainer_reads(tmp_path, fsdp_run):
    whole = fsdp_run[2]
    saver = ModelCheckpoint(dirpath=str(tmp_path), filename="full", every_n_train_steps=STEPS // 2)
    model, _, _ = _fit(FSDPStrategy(state_dict_type="full"), max_steps=STEPS // 2, callbacks=[saver])
    path = tmp_path / "full.ckpt"
    assert path.is_file()
    ckpt = torch.load(path, weights_only=False)
    assert set(ckpt["state_dict"]) == set(Net().state_dict())
    for name, value in ckpt["state_dict"].items():  # whole tensors, the trained ones
        assert type(value) is torch.Tensor
        torch.testing.assert_close(value, model.state_dict()[name], rtol=0, atol=0)
    plain = Net()
    plain.load_state_dict(ckpt["state_dict"])  # a module outside any run reads it
    # and a sharded run resumes from it, here at 4 ranks, with the uninterrupted run's losses
    _, _, resumed = _fit_resumed(str(path), devices=4, strategy="fsdp")
    torch.testing.assert_close(torch.tensor(resumed.losses[STEPS // 2:]), torch.tensor(whole.losses[STEPS // 2:]),
                               rtol=0, atol=1e-5)


def test_configure_model_shards_the_module_itself_under_model_parallel_strategy():
    _, _, ddp = _fit("ddp", max_steps=8)
    # Lightning's "auto" would make a 1 x 2 mesh here (data parallel across machines, tensor parallel inside)
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    model, trainer, record = _fit(strategy, max_steps=8, model=SelfSharded)
    assert record.sharded and record.local_bytes == [record.full_bytes // 2] * 2
    assert trainer.fit_info["strategy"] == "model_parallel" and trainer.fit_info["mesh"] == (2, 1)
    torch.testing.assert_close(torch.tensor(record.losses), torch.tensor(ddp.losses), rtol=0, atol=1e-5)


def test_model_parallel_strategy_without_configure_model_names_the_hook():
    with pytest.raises(RankFailed, match="override the `configure_model\\(\\)` hook"):
        _fit(ModelParallelStrategy(), max_steps=1)


@pytest.mark.parametrize("kwargs, match", [
    ({"cpu_offload": True}, None),  # accepted here; refused in the rank when the accelerator is the CPU
    ({"limit_all_gathers": True}, "FSDP1 constructor argument"),
    ({"parallel_devices": [torch.device("cpu")]}, r"Trainer\(devices=...\)"),
    ({"device_mesh": "2x2"}, "tuple"),
    ({"mixed_precision": "bf16"}, "MixedPrecisionPolicy"),
])
def test_lightning_arguments_are_honoured_or_refused_with_the_fix(kwargs, match):
    if match is None:
        assert FSDPStrategy(**kwargs).sharding_plan.cpu_offload
        return
    with pytest.raises(TrainerConfigError, match=match):
        FSDPStrategy(**kwargs)


def test_honoured_arguments_reach_the_plan():
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy
    plan = FSDPStrategy(sharding_strategy="HYBRID_SHARD", auto_wrap_policy=[Block], state_dict_type="sharded",
                        activation_checkpointing_policy={Block}, mixed_precision=MixedPrecision(
                            param_dtype=torch.bfloat16, reduce_dtype=torch.float32)).sharding_plan
    assert plan.hybrid and plan.reshard_after_forward and plan.wrap_classes == (Block,)
    assert plan.checkpoint_classes == (Block,) and plan.state_dict_type == "sharded"
    assert plan.mixed_precision == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert not FSDPStrategy(sharding_strategy="SHARD_GRAD_OP").sharding_plan.reshard_after_forward
    assert ModelParallelStrategy(save_distributed_checkpoint=False).sharding_plan.state_dict_type == "full"
    assert Trainer(strategy="fsdp", accelerator="cpu", devices=2).config.strategy == "fsdp"


def test_cpu_offload_on_the_cpu_is_refused_in_the_rank():
    with pytest.raises(RankFailed, match="remove cpu_offload"):
        _fit(FSDPStrategy(cpu_offload=True), max_steps=1)


def test_model_parallel_auto_sizes_are_lightnings():
    from gpulayer.trainer.strategies.fsdp_plan import mesh_layout
    plan = ModelParallelStrategy().sharding_plan
    assert mesh_layout(plan, world=4, num_nodes=2) == ((2, 2), ("data_parallel", "tensor_parallel"))
    assert mesh_layout(FSDPStrategy().sharding_plan, 4, 2) == ((4,), ("shard",))
    assert mesh_layout(FSDPStrategy(sharding_strategy="HYBRID_SHARD").sharding_plan, 4, 2) == ((2, 2),
                                                                                              ("replicate", "shard"))
    with pytest.raises(TrainerConfigError, match="product is 4"):
        mesh_layout(ModelParallelStrategy(data_parallel_size=3).sharding_plan, 4, 2)


@pytest.fixture(scope="module")
def fsdp_fleet(tmp_path_factory):
    from gpulayer.app import redis_client
    from gpulayer.lab.fleet import wait_until
    from gpulayer.store.gangs import GangStore
    from tests.fleets import running_fleet

    with running_fleet(tmp_path_factory.mktemp("fsdp-fleet"), {n: dict(slots=2, zone="eu-1a") for n in ("m1", "m2")}) as f:
        f.connect()
        yield f
        wait_until(lambda: GangStore(redis_client()).held() == {}, 20, "every slot to be free after the test")


def test_two_machines_of_two_ranks_shard_over_four_on_the_cluster(fsdp_fleet, fsdp_run):
    fsdp_fleet.wait_workers(["m1", "m2"])  # both live now (a loaded host can delay a heartbeat)
    seed_everything(3)
    model, record = Net(), Record()
    trainer = Trainer(num_nodes=2, devices=2, strategy="fsdp", accelerator="cpu", max_steps=STEPS, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[record])
    trainer.fit(model, lambda: DataLoader(_data(), batch_size=4))  # 4 ranks x 4: the 2-rank run's batches
    info = trainer.fit_info
    assert info["strategy"] == "fsdp" and (info["world_size"], info["num_nodes"]) == (4, 2)
    assert sorted(info["workers"]) == ["m1", "m2"] and info["mesh"] == (4,)
    assert record.local_bytes == [record.full_bytes // 4] * 4
    torch.testing.assert_close(torch.tensor(record.losses), torch.tensor(fsdp_run[2].losses), rtol=0, atol=1e-5)
    for a, b in zip(model.state_dict().values(), fsdp_run[0].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


class Validated(Net):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer_stack(x), y), sync_dist=True)

    def layer_stack(self, x):  # the root's own layers, reached outside forward: unsharded by validation_step's hooks
        return self.out(self.blocks(self.inp(x)))


def test_validate_in_two_sharded_ranks_gives_the_loss_of_the_whole_model():
    model, trainer, _ = _fit("fsdp", max_steps=2, model=Validated)
    out = trainer.validate(model, DataLoader(_data(), batch_size=16))
    x, y = _data().tensors
    with torch.no_grad():
        expected = nn.functional.mse_loss(model(x), y)  # the caller's model: whole, with the trained weights
    assert out[0]["val_loss"] == pytest.approx(float(expected), abs=1e-5)


def test_one_device_shards_over_a_group_of_one_in_this_process():
    _, trainer, record = _fit("fsdp", devices=1, max_steps=3)
    assert record.sharded and record.local_bytes == [record.full_bytes]
    assert trainer.global_step == 3 and trainer.fit_info["world_size"] == 1 and len(record.losses) == 3
    assert not dist.is_initialized()  # the group of one is gone with the fit


def test_fsdp1_wrap_policies_choose_the_submodules_to_shard_children_first():
    import functools

    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

    from gpulayer.trainer.strategies.fsdp import _to_wrap
    net = Net()
    by_class = _to_wrap(net, FSDPStrategy(auto_wrap_policy=ModuleWrapPolicy({Block})).sharding_plan)
    assert by_class == list(net.blocks)[::-1]
    by_size = FSDPStrategy(auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=1000))
    chosen = _to_wrap(net, by_size.sharding_plan)
    assert net.blocks in chosen and chosen.index(net.blocks[0].linear) < chosen.index(net.blocks)  # children first
    assert net not in chosen  # the root is sharded last, by the strategy itself


def test_save_last_writes_a_sharded_last_that_ckpt_path_last_resumes(tmp_path):
    def saver():
        return ModelCheckpoint(dirpath=str(tmp_path), save_last=True, every_n_train_steps=2, save_top_k=1)

    _fit(FSDPStrategy(state_dict_type="sharded"), max_steps=4, callbacks=[saver()])
    assert (tmp_path / "last.ckpt" / META_FILE).is_file()
    kept = [p for p in os.listdir(tmp_path) if p != "last.ckpt"]
    assert kept == ["epoch=0-step=4.ckpt"]  # top-1: the directory of step 2 was removed
    seed_everything(3)
    record = Record()
    trainer = Trainer(strategy=FSDPStrategy(state_dict_type="sharded"), accelerator="cpu", devices=2, max_steps=6,
                      logger=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[saver(), record])
    trainer.fit(Net(), lambda: DataLoader(_data(), batch_size=8), ckpt_path="last")
    assert trainer.global_step == 6 and record.start_step == 4  # it went on from the last directory


class FailsOnce(Net):
    """Rank 3 of the first attempt fails right after the sharded checkpoint of step 10 is whole."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0 and self.global_step == STEPS // 2 \
                and self.global_rank == 3:
            raise ValueError("rank three fails once")


def test_a_restarted_cluster_fit_resumes_from_its_sharded_checkpoint(fsdp_fleet, fsdp_run, tmp_path):
    fsdp_fleet.wait_workers(["m1", "m2"])
    seed_everything(3)
    model, record = FailsOnce(), Record()
    saver = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=5, save_last=True)
    trainer = Trainer(num_nodes=2, devices=2, strategy=FSDPStrategy(state_dict_type="sharded"), accelerator="cpu",
                      max_steps=STEPS, max_restarts=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[record, saver])
    trainer.fit(model, lambda: DataLoader(_data(), batch_size=4))
    info = trainer.fit_info
    assert info["restarts"] == 1 and [a["outcome"] for a in info["attempts"]] == ["failed", "succeeded"]
    assert info["resumed_from"]["global_step"] == STEPS // 2 and os.path.isdir(info["resumed_from"]["path"])
    assert record.start_step == STEPS // 2  # attempt 1 began at the checkpoint
    # steps 1-10 (restored with the recorder's state) then 11-20 of attempt 1: the uninterrupted run's losses
    torch.testing.assert_close(torch.tensor(record.losses), torch.tensor(fsdp_run[2].losses), rtol=0, atol=1e-5)
