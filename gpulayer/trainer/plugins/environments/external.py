"""Environments whose processes a launcher started (torchrun, Kubeflow's PyTorchJob): everything is read from
the variables it set; ``set_world_size``/``set_global_rank`` are ignored (the launcher's values win)."""

from __future__ import annotations

import os

from gpulayer.trainer.plugins.environments.cluster_environment import ClusterEnvironment, env_int


class _Launched(ClusterEnvironment):
    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return env_int("MASTER_PORT")

    def world_size(self) -> int:
        return env_int("WORLD_SIZE")

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return env_int("RANK")

    def set_global_rank(self, rank: int) -> None:
        pass


class TorchElasticEnvironment(_Launched):
    """torchrun / torchelastic: ``RANK``, ``GROUP_RANK`` (node), ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; detected when the first four are set."""

    @staticmethod
    def detect() -> bool:
        return all(v in os.environ for v in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))

    def local_rank(self) -> int:
        return env_int("LOCAL_RANK")

    def node_rank(self) -> int:
        return env_int("GROUP_RANK")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        world = env_int("WORLD_SIZE", 0)
        if world and num_devices * num_nodes != world:
            from gpulayer.trainer.utilities.rank_zero import rank_zero_warn
            rank_zero_warn(f"WORLD_SIZE={world} from torchrun differs from devices={num_devices} x "
                           f"num_nodes={num_nodes}; the launcher's value is used.")


class KubeflowEnvironment(_Launched):
    """Kubeflow's PyTorchJob: one process per pod, ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and
    ``RANK`` (which is also the node rank; the local rank is 0). Never detected: pass it in ``plugins``."""

    @staticmethod
    def detect() -> bool:
        raise NotImplementedError("The Kubeflow environment can't be detected automatically.")

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()
