"""``SLURMEnvironment``: processes started by ``srun``; the world is read from SLURM's variables."""

from __future__ import annotations

import os
import re
import signal

from gpulayer.trainer.plugins.environments.cluster_environment import ClusterEnvironment, env_int


class SLURMEnvironment(ClusterEnvironment):
    """``SLURM_NTASKS`` (world size), ``SLURM_PROCID`` (global rank), ``SLURM_LOCALID``, ``SLURM_NODEID``;
    the main address is ``MASTER_ADDR`` or the first host of ``SLURM_NODELIST``, the port ``MASTER_PORT`` or
    15000 + the last four digits of ``SLURM_JOB_ID`` (12910 without a job id). Detected when ``SLURM_NTASKS``
    is set and the job is not named ``bash`` or ``interactive`` (an interactive allocation)."""

    def __init__(self, auto_requeue: bool = True, requeue_signal: signal.Signals | None = None) -> None:
        self.auto_requeue = auto_requeue
        self.requeue_signal = requeue_signal if requeue_signal is not None else getattr(signal, "SIGUSR1", None)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        if "MASTER_ADDR" not in os.environ:
            os.environ["MASTER_ADDR"] = self.resolve_root_node_address(os.environ.get("SLURM_NODELIST", "127.0.0.1"))
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" not in os.environ:
            job_id = self.job_id()
            os.environ["MASTER_PORT"] = str(15000 + job_id % 10000 if job_id is not None else 12910)
        return env_int("MASTER_PORT")

    @staticmethod
    def detect() -> bool:
        return "SLURM_NTASKS" in os.environ and SLURMEnvironment.job_name() not in ("bash", "interactive")

    @staticmethod
    def job_name() -> str | None:
        return os.environ.get("SLURM_JOB_NAME")

    @staticmethod
    def job_id() -> int | None:
        """``SLURM_JOB_ID`` as an int; None outside a batch job (or in an interactive one)."""
        job_id = os.environ.get("SLURM_JOB_ID")
        if job_id is None or SLURMEnvironment.job_name() in ("bash", "interactive"):
            return None
        try:
            return int(job_id)
        except ValueError:
            return None

    def world_size(self) -> int:
        return env_int("SLURM_NTASKS")

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return env_int("SLURM_PROCID")

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return env_int("SLURM_LOCALID")

    def node_rank(self) -> int:
        return env_int("SLURM_NODEID")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE")
        if per_node is not None and per_node.isdigit() and int(per_node) != num_devices:
            raise ValueError(f"You set `devices={num_devices}` in Lightning, but the number of tasks per node "
                             f"configured in SLURM `--ntasks-per-node={per_node}` does not match. "
                             "HINT: Set `devices={per_node}`.")
        nnodes = os.environ.get("SLURM_NNODES")
        if nnodes is not None and nnodes.isdigit() and int(nnodes) != num_nodes:
            raise ValueError(f"You set `num_nodes={num_nodes}` in Lightning, but the number of nodes configured "
                             f"in SLURM `--nodes={nnodes}` does not match. HINT: Set `num_nodes={nnodes}`.")

    @staticmethod
    def resolve_root_node_address(nodes: str) -> str:
        """The first host of a SLURM node list: ``"host[3-5,7],other"`` -> ``"host3"``."""
        nodes = re.sub(r"\[(.*?)[,-].*\]", r"[\1]", nodes)  # keep the first number of the first range
        nodes = re.sub(r"\[(.*?)\]", r"\1", nodes)
        return nodes.split(" ")[0].split(",")[0]
