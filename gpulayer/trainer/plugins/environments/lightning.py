"""``LightningEnvironment``: the default; the Trainer starts the processes (or torchrun-style variables say so)."""

from __future__ import annotations

import os

from gpulayer.trainer.plugins.environments.cluster_environment import ClusterEnvironment, env_int, find_free_port


class LightningEnvironment(ClusterEnvironment):
    """Reads ``MASTER_ADDR`` (default 127.0.0.1), ``MASTER_PORT`` (default: a free port, then kept),
    ``LOCAL_RANK``, ``NODE_RANK``/``GROUP_RANK``; world size and global rank are set by the strategy."""

    def __init__(self) -> None:
        self._main_port: int = -1
        self._global_rank: int = 0
        self._world_size: int = 1

    @property
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        if self._main_port == -1:
            self._main_port = env_int("MASTER_PORT") if "MASTER_PORT" in os.environ else find_free_port()
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return env_int("LOCAL_RANK", 0)

    def node_rank(self) -> int:
        return env_int("NODE_RANK", env_int("GROUP_RANK", 0))

    def teardown(self) -> None:
        if "WORLD_SIZE" in os.environ:
            del os.environ["WORLD_SIZE"]
