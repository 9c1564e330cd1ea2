"""The direct launcher: every rank gets the environment torchrun would give it.

torchrun starts an elastic agent per machine, which rendezvouses, then spawns
the ranks. gpulayer already knows the whole placement when it launches, so it
writes the same variables itself and starts the ranks directly: no rendezvous
round. The TCP store is hosted by node 0's worker (:class:`StoreHost`), as
torchrun's agent hosts it (``TORCHELASTIC_USE_AGENT_STORE=True``), or, where
the worker has not imported torch, by rank 0 (``False``), exactly as
``torch.distributed.init_process_group("env://")`` expects either way.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Callable
from dataclasses import dataclass

BACKEND_ENV = "GPULAYER_BACKEND"  # a distributed job's backend: the default of gpulayer.init_process_group()


@dataclass(frozen=True)
class RankLayout:
    """Where one rank sits in a job of ``nodes`` x ``procs_per_node`` processes."""

    node_rank: int
    local_rank: int
    nodes: int
    procs_per_node: int

    @property
    def rank(self) -> int:
        return self.node_rank * self.procs_per_node + self.local_rank

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def rank_env(
    layout: RankLayout,
    *,
    master_addr: str,
    master_port: int,
    run_id: str,
    restart_count: int = 0,
    max_restarts: int = 0,
    cpu_count: int | None = None,
    base_env: dict[str, str] | None = None,
    backend: str | None = None,
    agent_store: bool = False,
) -> dict[str, str]:
    """The environment for one rank: ``base_env`` plus what torchrun sets.

    ``OMP_NUM_THREADS`` is the machine's cores divided by its local processes
    (at least 1) unless ``base_env`` already sets it, as torchrun would.
    ``backend``: the job's (``distributed(backend=...)``), in ``GPULAYER_BACKEND``
    for ``gpulayer.init_process_group()``. ``agent_store``: the store at
    ``master_addr:master_port`` is already listening (:class:`StoreHost`); else rank 0 hosts it.
    """
    env = dict(os.environ if base_env is None else base_env)
    cores = cpu_count or os.cpu_count() or 1
    env.update(
        RANK=str(layout.rank),
        LOCAL_RANK=str(layout.local_rank),
        WORLD_SIZE=str(layout.world_size),
        LOCAL_WORLD_SIZE=str(layout.procs_per_node),
        GROUP_RANK=str(layout.node_rank),
        GROUP_WORLD_SIZE=str(layout.nodes),
        ROLE_RANK=str(layout.rank),
        ROLE_WORLD_SIZE=str(layout.world_size),
        ROLE_NAME="default",
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        TORCHELASTIC_RUN_ID=run_id,
        TORCHELASTIC_RESTART_COUNT=str(restart_count),
        TORCHELASTIC_MAX_RESTARTS=str(max_restarts),
        TORCHELASTIC_USE_AGENT_STORE=str(agent_store),
    )
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // layout.procs_per_node)))
    if backend is not None:
        env[BACKEND_ENV] = backend
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# Set by the worker's start (worker/starting.py): waits up to that many seconds for its background preload.
preload_wait: Callable[[float], bool] | None = None
PRELOAD_WAIT = 15.0  # seconds


class StoreHost:
    """A distributed job's TCP store, hosted by the process that starts its ranks, as torchrun's agent does.

    When rank 0 hosts the store, the other ranks' first connection is often refused (rank 0 is a few
    milliseconds behind), and torch's client then backs off 0.25-0.75 s before it tries again: the larger
    part of a warm 2 x 2 job's start. A store that listens before any rank starts is never refused.
    Needs torch imported in this process already (the worker preloads it): :meth:`start` returns None
    otherwise, and rank 0 hosts the store as before, rather than this process importing torch for seconds.
    """

    def __init__(self, store, port: int):
        self._store = store
        self.port = port

    @classmethod
    def start(cls, host: str, timeout_s: float = 1800.0) -> "StoreHost | None":
        dist = sys.modules.get("torch.distributed")
        if (dist is None or getattr(dist.__spec__, "_initializing", False)) and preload_wait is not None:
            # The worker preloads torch in the background (worker/starting.py): a gang placed on a worker just
            # started waits for it here (its ranks need torch anyway), bounded; past the bound rank 0 hosts it.
            preload_wait(PRELOAD_WAIT)
            dist = sys.modules.get("torch.distributed")
        if dist is None or getattr(dist.__spec__, "_initializing", False) or not dist.is_available():
            return None
        from datetime import timedelta

        # Port 0: the kernel's choice, bound at once (no window between picking a free port and using it).
        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
        return cls(store, store.port)

    def close(self) -> None:
        """Stop listening (the last reference to torch's store goes; its destructor stops the server)."""
        self._store = None


def torchrun_command(nodes: int, procs_per_node: int, node_rank: int, master_addr: str, master_port: int,
                     target: list[str], *, max_restarts: int = 0, run_id: str = "gpulayer",
                     log_dir: str | None = None) -> list[str]:
    """torchrun on one machine with a static rendezvous at rank 0's address (``launcher="torchrun"``).

    ``--tee 3`` prefixes every line with its local rank, so output can be told apart. ``log_dir``:
    where torchrun writes its per-rank logs (else a ``torchelastic_*`` temp directory it never removes).
    """
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
            f"--nproc-per-node={procs_per_node}", f"--node-rank={node_rank}", f"--master-addr={master_addr}",
            f"--master-port={master_port}", f"--max-restarts={max_restarts}", f"--rdzv-id={run_id}",
            "--monitor-interval=0.1", "--tee=3", *([f"--log-dir={log_dir}"] if log_dir else []), *target]


def interface_for(address: str, interfaces: dict[str, list[str]] | None = None) -> str | None:
    """The network interface that holds ``address`` on this machine, or None.

    Gloo and NCCL pick the interface the hostname resolves to, often loopback;
    the ranks must use the one the worker advertises, or peers on other
    machines are told to connect to 127.0.0.1.
    """
    if interfaces is None:
        import psutil

        interfaces = {name: [a.address for a in addrs if a.family == socket.AF_INET]
                      for name, addrs in psutil.net_if_addrs().items()}
    for name, ips in interfaces.items():
        if address in ips:
            return name
    return None


def socket_ifname_env(address: str, env: dict[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` for the advertised address, unless the user set them."""
    name = interface_for(address)
    out = {}
    if name:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if var not in env:
                out[var] = name
    return out
