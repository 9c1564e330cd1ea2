"""Cluster environments read the variables their launcher documents; TorchSyncBatchNorm converts and reverts."""

from __future__ import annotations

import pytest
import torch

from gpulayer.trainer.plugins.environments import (
    KubeflowEnvironment, LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment, XLAEnvironment,
    detect_environment)
from gpulayer.trainer.plugins.layer_sync import LayerSync, TorchSyncBatchNorm

_ALL_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK",
             "LOCAL_WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NODELIST",
             "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES")


@pytest.fixture
def clean_env(monkeypatch):
    """None of the variables set, and each one as it was after the test, also those the environments write
    themselves (SLURM's main_address/main_port set MASTER_ADDR/MASTER_PORT, as Lightning's do): a MASTER_ADDR left
    behind sends every later DDP run of this test process to a host that does not exist."""
    for name in _ALL_VARS:
        monkeypatch.setenv(name, "")  # recorded, so the undo restores (or removes) it
        monkeypatch.delenv(name)
    return monkeypatch


def test_lightning_environment_defaults_and_variables(clean_env):
    env = LightningEnvironment()
    assert env.detect() and not env.creates_processes_externally
    assert env.main_address == "127.0.0.1"
    port = env.main_port
    assert 0 < port < 65536 and env.main_port == port  # chosen once, then kept
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (1, 0, 0, 0)
    env.set_world_size(4)
    env.set_global_rank(3)
    assert (env.world_size(), env.global_rank()) == (4, 3)
    clean_env.setenv("MASTER_ADDR", "10.0.0.1")
    clean_env.setenv("MASTER_PORT", "1234")
    clean_env.setenv("LOCAL_RANK", "2")
    clean_env.setenv("NODE_RANK", "1")
    env = LightningEnvironment()
    assert (env.main_address, env.main_port, env.local_rank(), env.node_rank()) == ("10.0.0.1", 1234, 2, 1)
    assert env.creates_processes_externally


def test_torchelastic_environment(clean_env):
    assert not TorchElasticEnvironment.detect()
    for name, value in dict(MASTER_ADDR="host", MASTER_PORT="29500", WORLD_SIZE="8", RANK="5", LOCAL_RANK="1",
                            GROUP_RANK="2", LOCAL_WORLD_SIZE="2").items():
        clean_env.setenv(name, value)
    assert TorchElasticEnvironment.detect()
    env = TorchElasticEnvironment()
    assert env.creates_processes_externally
    assert (env.main_address, env.main_port, env.world_size(), env.global_rank(), env.local_rank(),
            env.node_rank()) == ("host", 29500, 8, 5, 1, 2)
    env.set_world_size(100)  # the launcher's value wins
    assert env.world_size() == 8
    assert isinstance(detect_environment(), TorchElasticEnvironment)


def test_slurm_environment(clean_env):
    assert not SLURMEnvironment.detect()
    for name, value in dict(SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1", SLURM_NODEID="1",
                            SLURM_NODELIST="gpu[12-13],other", SLURM_JOB_ID="1234567", SLURM_JOB_NAME="train").items():
        clean_env.setenv(name, value)
    assert SLURMEnvironment.detect()
    env = SLURMEnvironment()
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 3, 1, 1)
    assert env.main_address == "gpu12"
    assert env.main_port == 15000 + 4567
    assert isinstance(detect_environment(), SLURMEnvironment)
    clean_env.setenv("SLURM_NTASKS_PER_NODE", "2")
    env.validate_settings(num_devices=2, num_nodes=2)
    with pytest.raises(ValueError, match="ntasks-per-node=2"):
        env.validate_settings(num_devices=4, num_nodes=2)
    clean_env.setenv("SLURM_JOB_NAME", "interactive")  # an interactive allocation is not detected
    assert not SLURMEnvironment.detect()
    assert isinstance(detect_environment(), LightningEnvironment)


def test_slurm_root_node_address():
    assert SLURMEnvironment.resolve_root_node_address("node1") == "node1"
    assert SLURMEnvironment.resolve_root_node_address("a[3-5,7],b") == "a3"
    assert SLURMEnvironment.resolve_root_node_address("a[07]") == "a07"


def test_kubeflow_environment(clean_env):
    with pytest.raises(NotImplementedError):
        KubeflowEnvironment.detect()
    for name, value in dict(MASTER_ADDR="master-0", MASTER_PORT="23456", WORLD_SIZE="3", RANK="2").items():
        clean_env.setenv(name, value)
    env = KubeflowEnvironment()
    assert (env.main_address, env.main_port, env.world_size(), env.global_rank(), env.local_rank(),
            env.node_rank()) == ("master-0", 23456, 3, 2, 0, 2)


def test_xla_environment_without_xla():
    from gpulayer.trainer.accelerators import XLAAccelerator
    if XLAAccelerator.is_available():
        pytest.skip("an XLA device is present")
    assert not XLAEnvironment.detect()
    with pytest.raises(ModuleNotFoundError, match="torch_xla"):
        XLAEnvironment()


def test_torch_sync_batchnorm_converts_and_reverts():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4),
                                torch.nn.Sequential(torch.nn.BatchNorm1d(4)))
    with torch.no_grad():
        model[1].weight.fill_(2.0)
    plugin = TorchSyncBatchNorm()
    assert isinstance(plugin, LayerSync)
    synced = plugin.apply(model)
    assert isinstance(synced[1], torch.nn.SyncBatchNorm) and isinstance(synced[2][0], torch.nn.SyncBatchNorm)
    reverted = plugin.revert(synced)
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in reverted.modules())
    assert isinstance(reverted[1], torch.nn.modules.batchnorm._BatchNorm)
    assert torch.equal(reverted[1].weight, torch.full((4,), 2.0))
    reverted.eval()
    assert reverted[:2](torch.randn(2, 3, 5, 5)).shape == (2, 4, 5, 5)


def test_sync_batchnorm_flag_and_layer_sync_plugin():
    from gpulayer.trainer import Trainer
    from gpulayer.trainer.utilities.exceptions import MisconfigurationException
    trainer = Trainer(accelerator="cpu", strategy="ddp", devices=2, sync_batchnorm=True)
    assert isinstance(trainer.strategy._layer_sync, TorchSyncBatchNorm)
    plugin = TorchSyncBatchNorm()
    assert Trainer(accelerator="cpu", strategy="ddp", devices=2, plugins=[plugin]).strategy._layer_sync is plugin
    assert Trainer(accelerator="cpu", strategy="ddp", devices=2).strategy._layer_sync is None
    with pytest.raises(MisconfigurationException, match=r"sync_batchnorm=True\)` and provided a `LayerSync`"):
        Trainer(sync_batchnorm=True, plugins=[TorchSyncBatchNorm()])
    with pytest.raises(MisconfigurationException, match="multiple values for ClusterEnvironment"):
        Trainer(plugins=[LightningEnvironment(), SLURMEnvironment()])


def test_ddp_setup_module_applies_layer_sync(monkeypatch, tmp_path):
    import torch.distributed as dist
    from gpulayer.trainer.strategies import DDPStrategy
    for name, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(LightningEnvironment().main_port),
                            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0").items():
        monkeypatch.setenv(name, value)
    strategy = DDPStrategy()
    strategy._layer_sync = TorchSyncBatchNorm()
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    strategy.setup_environment()
    try:
        with pytest.raises(ValueError, match="only work with GPU"):  # torch's DDP: SyncBatchNorm needs a GPU
            strategy.setup_module(model)
        assert isinstance(model[1], torch.nn.SyncBatchNorm)  # converted before DDP wrapped it
    finally:
        strategy.teardown()
        if dist.is_initialized():
            dist.destroy_process_group()


def test_ddp_strategy_cluster_environment(clean_env):
    from gpulayer.trainer import Trainer
    assert isinstance(Trainer(accelerator="cpu", strategy="ddp", devices=2).strategy.cluster_environment,
                      LightningEnvironment)
    env = KubeflowEnvironment()
    assert Trainer(accelerator="cpu", strategy="ddp", devices=2, plugins=[env]).strategy.cluster_environment is env


def test_strategy_names_are_case_insensitive():
    from gpulayer.trainer import Trainer
    from gpulayer.trainer.strategies import DDPStrategy
    for name in ("DDP", "DDP_FIND_UNUSED_PARAMETERS_FALSE", "ddp_spawn_find_unused_parameters_false"):
        strategy = Trainer(accelerator="cpu", strategy=name, devices=2).strategy
        assert isinstance(strategy, DDPStrategy) and not strategy.find_unused_parameters
