"""Cluster environments (Lightning's ``plugins.environments``): where a process reads its rank, the world size
and the rendezvous address from. ``detect_environment()`` picks the one this process runs under."""

from __future__ import annotations

from gpulayer.trainer.plugins.environments.cluster_environment import ClusterEnvironment
from gpulayer.trainer.plugins.environments.external import KubeflowEnvironment, TorchElasticEnvironment
from gpulayer.trainer.plugins.environments.lightning import LightningEnvironment
from gpulayer.trainer.plugins.environments.slurm import SLURMEnvironment
from gpulayer.trainer.plugins.environments.xla import XLAEnvironment


def detect_environment() -> ClusterEnvironment:
    """SLURM, then torchrun, then XLA when detected; else ``LightningEnvironment``."""
    for env_type in (SLURMEnvironment, TorchElasticEnvironment, XLAEnvironment):
        if env_type.detect():
            return env_type()
    return LightningEnvironment()


__all__ = ["ClusterEnvironment", "KubeflowEnvironment", "LightningEnvironment", "SLURMEnvironment",
           "TorchElasticEnvironment", "XLAEnvironment", "detect_environment"]
