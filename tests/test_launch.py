"""The direct launcher's environment: what torchrun would set, computed without torchrun."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpulayer.lab.fleet import wait_until
from gpulayer.models import GangSpec, Resources
from gpulayer.procs.env import RankLayout, StoreHost, interface_for, rank_env, torchrun_command


def test_rank_env_matches_torchrun_names_and_values():
    env = rank_env(RankLayout(node_rank=1, local_rank=1, nodes=2, procs_per_node=4), master_addr="10.0.0.5",
                   master_port=29500, run_id="job1", restart_count=2, max_restarts=3, cpu_count=16, base_env={})
    assert env == {
        "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "5", "ROLE_WORLD_SIZE": "8", "ROLE_NAME": "default",
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job1",
        "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "OMP_NUM_THREADS": "4"}


def test_rank_env_carries_the_jobs_backend():
    layout = RankLayout(0, 1, 1, 2)
    env = rank_env(layout, master_addr="a", master_port=1, run_id="r", base_env={}, backend="nccl")
    assert env["GPULAYER_BACKEND"] == "nccl"
    assert "GPULAYER_BACKEND" not in rank_env(layout, master_addr="a", master_port=1, run_id="r", base_env={})


def test_a_store_hosted_by_the_worker_serves_the_ranks_and_says_so_in_their_environment(monkeypatch):
    from datetime import timedelta

    import torch.distributed as dist

    host = StoreHost.start("127.0.0.1")
    try:
        client = dist.TCPStore("127.0.0.1", host.port, is_master=False, timeout=timedelta(seconds=10))
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        host.close()
    env = rank_env(RankLayout(0, 0, 1, 1), master_addr="a", master_port=host.port, run_id="r", base_env={},
                   agent_store=True)
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    monkeypatch.delitem(sys.modules, "torch.distributed")  # a worker without torch: rank 0 hosts it instead
    assert StoreHost.start("127.0.0.1") is None


def test_init_process_group_defaults_to_the_backend_in_the_environment(monkeypatch):
    import torch.distributed as dist

    import gpulayer

    seen = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.append(backend))
    monkeypatch.setenv("GPULAYER_BACKEND", "nccl")  # not what this CPU-only machine would pick by itself
    gpulayer.init_process_group()
    gpulayer.init_process_group("gloo")  # a backend named wins
    monkeypatch.delenv("GPULAYER_BACKEND")
    gpulayer.init_process_group()
    assert seen == ["nccl", "gloo", "nccl" if torch_cuda() else "gloo"]


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_nccl_needs_cuda_resources():
    with pytest.raises(ValueError, match="nccl.*CUDA"):
        GangSpec(gang_id="g", nodes=1, procs_per_node=2, backend="nccl")
    assert GangSpec(gang_id="g", nodes=1, procs_per_node=2, backend="nccl", resources=Resources(cuda=True)).backend == "nccl"


def test_user_omp_threads_win_and_never_below_one():
    layout = RankLayout(0, 0, 1, 8)
    assert rank_env(layout, master_addr="a", master_port=1, run_id="r", base_env={"OMP_NUM_THREADS": "7"},
                    cpu_count=2)["OMP_NUM_THREADS"] == "7"
    assert rank_env(layout, master_addr="a", master_port=1, run_id="r", base_env={}, cpu_count=2)[
        "OMP_NUM_THREADS"] == "1"


def test_interface_for_the_advertised_address():
    ifaces = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.5"], "eth1": []}
    assert interface_for("10.0.0.5", ifaces) == "eth0"
    assert interface_for("127.0.0.1", ifaces) == "lo"
    assert interface_for("10.9.9.9", ifaces) is None


def test_torchrun_command_uses_a_static_rendezvous():
    cmd = torchrun_command(2, 4, 1, "10.0.0.5", 29500, ["-m", "gpulayer.gang.rank", "g", "0"])
    assert "--nnodes=2" in cmd and "--nproc-per-node=4" in cmd and "--node-rank=1" in cmd
    assert "--master-addr=10.0.0.5" in cmd and "--master-port=29500" in cmd
    assert not any(a.startswith("--rdzv-backend") and "c10d" in a for a in cmd)


LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_stop_group_reaches_children_in_sessions_of_their_own():
    """As torchrun starts its ranks: a child in its own session is not in the launcher's group, and a
    launcher killed before it stops them must not leave them running."""
    import psutil

    from gpulayer.procs.stop import stop_group

    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    child = None
    try:
        child = psutil.Process(int(launcher.stdout.readline()))
        assert os.getpgid(child.pid) != launcher.pid
        stop_group([launcher], grace=0.2)
        assert launcher.poll() is not None
        assert wait_until(lambda: _gone(child), 10, "the launcher's child to be gone")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if child is not None and not _gone(child):
            child.kill()


def _gone(proc) -> bool:
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # killed; its new parent reaps it
    except psutil.NoSuchProcess:
        return True
