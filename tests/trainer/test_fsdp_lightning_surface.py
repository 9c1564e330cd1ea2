"""FSDPStrategy / ModelParallelStrategy as a Lightning user meets them: the attributes they read, the arguments
now honoured (NO_SHARD, checkpoint_io, precision_plugin, use_orig_params, the deprecated activation_checkpointing),
the checkpoint path rules and errors as Lightning words them, and ModelParallelStrategy's checks before a run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpulayer.trainer import Module, Trainer
from gpulayer.trainer.checkpoint import META_FILE
from gpulayer.trainer.plugins.io import TorchCheckpointIO
from gpulayer.trainer.plugins.precision import FSDPPrecision, HalfPrecision
from gpulayer.trainer.strategies import FSDPStrategy, ModelParallelStrategy
from tests.trainer.test_fsdp import Block, Net, _fit


def test_lightnings_attributes_read_as_lightnings():
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = FSDPStrategy()
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert strategy.cpu_offload == CPUOffload(offload_params=False) and strategy.kwargs == {"use_orig_params": True}
    assert isinstance(strategy.precision_plugin, FSDPPrecision) and strategy.precision_plugin.precision == "32-true"
    assert strategy.mixed_precision_config.param_dtype == torch.float32  # the precision plugin's config
    mp = MixedPrecision(param_dtype=torch.bfloat16)
    assert FSDPStrategy(mixed_precision=mp).mixed_precision_config is mp
    offload = CPUOffload(offload_params=True)
    assert FSDPStrategy(cpu_offload=offload).cpu_offload is offload
    assert FSDPStrategy(sharding_strategy=ShardingStrategy.SHARD_GRAD_OP).sharding_strategy.name == "SHARD_GRAD_OP"
    wrapped = FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}, device_mesh=(1, 2))
    assert isinstance(wrapped.kwargs["auto_wrap_policy"], ModuleWrapPolicy) and wrapped.kwargs["device_mesh"] == (1, 2)
    assert isinstance(wrapped._activation_checkpointing_kwargs["auto_wrap_policy"], ModuleWrapPolicy)


def test_the_trainers_own_strategy_object_reads_the_same():
    from torch.distributed.fsdp import ShardingStrategy
    trainer = Trainer(strategy=FSDPStrategy(sharding_strategy="SHARD_GRAD_OP", cpu_offload=True), accelerator="cpu",
                      devices=2)
    assert trainer.strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert trainer.strategy.cpu_offload.offload_params and trainer.strategy.kwargs["use_orig_params"]


def test_no_shard_is_a_mesh_of_world_by_one():
    from gpulayer.trainer.strategies.fsdp_plan import mesh_layout
    plan = FSDPStrategy(sharding_strategy="no_shard").sharding_plan
    assert plan.no_shard and mesh_layout(plan, world=4, num_nodes=2) == ((4, 1), ("replicate", "shard"))


def test_no_shard_in_two_ranks_keeps_every_parameter_whole_and_loses_what_ddp_loses():
    _, _, ddp = _fit("ddp", max_steps=6)
    _, trainer, record = _fit(FSDPStrategy(sharding_strategy="NO_SHARD"), max_steps=6)
    assert trainer.fit_info["mesh"] == (2, 1)
    assert record.local_bytes == [record.full_bytes] * 2  # nothing sharded: each rank holds all of it
    torch.testing.assert_close(torch.tensor(record.losses), torch.tensor(ddp.losses), rtol=0, atol=1e-5)


def test_a_precision_other_than_fsdp_precision_is_refused_with_lightnings_type_error():
    with pytest.raises(TypeError, match="can only work with the `FSDPPrecision"):
        FSDPStrategy(precision_plugin=HalfPrecision())
    strategy = FSDPStrategy()
    with pytest.raises(TypeError, match="can only work with the `FSDPPrecision"):
        strategy.precision_plugin = HalfPrecision()
    with pytest.raises(TypeError, match="can only work with the `FSDPPrecision"):
        Trainer(strategy="fsdp", accelerator="cpu", devices=2, plugins=[HalfPrecision()])
    # ModelParallelStrategy takes any precision plugin, as Lightning's does
    model_parallel = ModelParallelStrategy()
    model_parallel.precision_plugin = HalfPrecision()
    assert isinstance(model_parallel.precision_plugin, HalfPrecision)


def test_the_strategys_precision_plugin_is_the_trainers():
    plugin = FSDPPrecision("bf16-true")
    trainer = Trainer(strategy=FSDPStrategy(precision_plugin=plugin), accelerator="cpu", devices=2)
    assert trainer.config.precision_plugin is plugin and trainer.config.precision == "bf16-true"


class MarkingIO(TorchCheckpointIO):
    """Writes a marker beside each checkpoint: proof, across processes, that this IO wrote it."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        super().save_checkpoint(checkpoint, path, storage_options)
        with open(f"{path}.marked", "w") as f:
            f.write("by MarkingIO")


def test_a_full_checkpoint_of_two_ranks_is_written_through_the_strategys_checkpoint_io(tmp_path):
    from gpulayer.trainer.callbacks import ModelCheckpoint
    saver = ModelCheckpoint(dirpath=str(tmp_path), filename="full", every_n_train_steps=2)
    _fit(FSDPStrategy(checkpoint_io=MarkingIO()), max_steps=2, callbacks=[saver])
    assert (tmp_path / "full.ckpt").is_file() and (tmp_path / "full.ckpt.marked").read_text() == "by MarkingIO"


def test_use_orig_params_false_warns_that_fsdp2_keeps_them():
    with pytest.warns(UserWarning, match="always keeps the original parameters"):
        strategy = FSDPStrategy(use_orig_params=False)
    assert strategy.kwargs["use_orig_params"] is False


def test_the_deprecated_activation_checkpointing_is_honoured_with_lightnings_notice():
    with pytest.warns(DeprecationWarning, match="activation_checkpointing_policy"):
        strategy = FSDPStrategy(activation_checkpointing=[Block])
    assert strategy.sharding_plan.checkpoint_classes == (Block,)
    with pytest.raises(ValueError, match="cannot set both"):
        FSDPStrategy(activation_checkpointing=Block, activation_checkpointing_policy={Block})


def test_a_checkpointing_policy_callable_chooses_the_layers_to_recompute():
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from gpulayer.trainer.strategies.fsdp import _checkpoint_activations
    net = Net()
    plan = FSDPStrategy(activation_checkpointing_policy=ModuleWrapPolicy({Block})).sharding_plan
    _checkpoint_activations(net, plan.checkpoint_classes, plan.checkpoint_policy)
    assert [getattr(m, "_gpulayer_checkpointed", False) for m in (net.inp, *net.blocks, net.out)] == \
        [False, True, True, False]
    x = torch.randn(3, 16, requires_grad=True)
    net(x).sum().backward()  # recomputed in backward, the same gradients
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_an_unknown_state_dict_type_fails_when_a_trainer_takes_it_and_when_saving(tmp_path):
    strategy = FSDPStrategy(state_dict_type="local")
    with pytest.raises(ValueError, match="Unknown state_dict_type"):
        Trainer(strategy=strategy, accelerator="cpu", devices=2)
    with pytest.raises(ValueError, match="Unknown state_dict_type"):
        strategy.save_checkpoint({}, tmp_path / "x.ckpt")


def test_save_checkpoint_path_rules_outside_the_ranks(tmp_path):
    strategy = FSDPStrategy(state_dict_type="full")
    with pytest.raises(TypeError, match=r"FSDPStrategy.save_checkpoint\(..., storage_options=...\)` is not"):
        strategy.save_checkpoint({}, tmp_path / "a.ckpt", storage_options={})
    other = tmp_path / "not-a-checkpoint"
    other.mkdir()
    (other / "file").touch()
    with pytest.raises(IsADirectoryError, match="exists and is a directory"):
        strategy.save_checkpoint({"state_dict": {}}, other)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / META_FILE).touch()
    strategy.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, sharded)  # a sharded directory gives way
    assert sharded.is_file() and torch.equal(torch.load(sharded)["state_dict"]["w"], torch.ones(2))


def test_loading_a_directory_that_is_no_checkpoint_names_both_forms(tmp_path):
    with pytest.raises(ValueError, match="does not point to a valid checkpoint"):
        FSDPStrategy().load_checkpoint(checkpoint_path=tmp_path)


def test_a_sharded_directory_keeps_fsdps_weights_under_model_and_model_parallels_under_state_dict(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    from gpulayer.trainer.callbacks import ModelCheckpoint

    def names(path):
        return {n.split(".", 1)[0] for n in FileSystemReader(str(path)).read_metadata().state_dict_metadata}

    saver = ModelCheckpoint(dirpath=str(tmp_path), filename="fsdp", every_n_train_steps=2)
    _fit(FSDPStrategy(state_dict_type="sharded"), max_steps=2, callbacks=[saver])
    assert names(tmp_path / "fsdp.ckpt") == {"model", "optimizer_0"}  # Lightning's FSDPStrategy layout
    meta = torch.load(tmp_path / "fsdp.ckpt" / META_FILE, weights_only=False)
    assert "state_dict" not in meta and "optimizer_states" not in meta


class NoReset(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4, 4))


class SelfParallel(Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(NoReset())
        self.b = nn.Linear(4, 4)

    def configure_model(self):
        pass


def test_model_parallel_setup_checks_the_module_and_materializes_meta_tensors_naming_those_it_cannot_reset():
    strategy = ModelParallelStrategy()
    with pytest.raises(RuntimeError, match="device mesh before processes have initialized"):
        strategy.device_mesh
    plain = Module()
    strategy.model = strategy.lightning_module = plain
    with pytest.raises(TypeError, match="you are required to override the `configure_model"):
        strategy.setup(None)
    with torch.device("meta"):
        model = SelfParallel()
    strategy.model = strategy.lightning_module = model
    with pytest.warns(UserWarning, match=r"`reset_parameters\(\)` method for re-initialization: NoReset"):
        strategy.setup(None)
    assert not any(p.is_meta for p in model.parameters())


def test_model_parallel_sizes_that_do_not_make_the_world_are_a_runtime_error_in_lightnings_words():
    from gpulayer.trainer.strategies.fsdp_plan import mesh_layout
    with pytest.raises(RuntimeError, match="multiplied should equal the world size"):
        mesh_layout(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=3).sharding_plan, 4, 1)


def test_a_model_parallel_run_reads_its_mesh_from_the_strategy_property_in_configure_model():
    class Checked(Net):
        def configure_model(self):
            assert self.trainer.strategy.device_mesh is self.device_mesh
            assert self.device_mesh.mesh_dim_names == ("data_parallel", "tensor_parallel")
            from torch.distributed.fsdp import fully_shard
            fully_shard(self, mesh=self.device_mesh["data_parallel"])

    _, trainer, record = _fit(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), max_steps=2,
                              model=Checked)
    assert trainer.global_step == 2 and record.sharded

