"""``ClusterEnvironment``: where a rank learns its world (size, ranks, the main process's address) from."""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod


class ClusterEnvironment(ABC):
    """What a cluster tells one process: the rendezvous address and port, world size, global/local/node rank."""

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """True when the processes are started by the cluster (torchrun, srun), not by the Trainer."""

    @property
    @abstractmethod
    def main_address(self) -> str: ...

    @property
    @abstractmethod
    def main_port(self) -> int: ...

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether this process runs under this environment."""

    @abstractmethod
    def world_size(self) -> int: ...

    @abstractmethod
    def set_world_size(self, size: int) -> None: ...

    @abstractmethod
    def global_rank(self) -> int: ...

    @abstractmethod
    def set_global_rank(self, rank: int) -> None: ...

    @abstractmethod
    def local_rank(self) -> int: ...

    @abstractmethod
    def node_rank(self) -> int: ...

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when the Trainer's ``devices``/``num_nodes`` contradict the cluster; none by default."""

    def teardown(self) -> None:
        """Clean up what the environment set for the run; nothing by default."""


def env_int(name: str, default: int | None = None) -> int:
    """``os.environ[name]`` as an int; ``default`` when unset (a KeyError naming the variable if no default)."""
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise KeyError(f"environment variable {name} is not set")
        return default
    return int(value)


def find_free_port() -> int:
    """A TCP port free on this machine now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
