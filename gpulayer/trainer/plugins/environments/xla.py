"""``XLAEnvironment``: TPU processes started by torch_xla's launcher; its runtime says the world."""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.plugins.environments.cluster_environment import ClusterEnvironment


def _xr() -> Any:
    from gpulayer.trainer.accelerators import XLAAccelerator
    if not XLAAccelerator.is_available():
        raise ModuleNotFoundError("XLAEnvironment needs `torch_xla` and an XLA device: pip install torch_xla")
    import torch_xla.runtime as xr
    return xr


class XLAEnvironment(ClusterEnvironment):
    """World size, ranks and the host come from ``torch_xla.runtime``; detected when an XLA device is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _xr()
        super().__init__(*args, **kwargs)

    @property
    def creates_processes_externally(self) -> bool:
        return False

    @property
    def main_address(self) -> str:
        import torch_xla.core.xla_env_vars as xenv
        from torch_xla.utils.utils import getenv_as
        return getenv_as(xenv.TPU_MESH_CTLER_ADDR, str, "localhost")

    @property
    def main_port(self) -> int:
        import torch_xla.core.xla_env_vars as xenv
        from torch_xla.utils.utils import getenv_as
        return getenv_as(xenv.TPU_MESH_CTLER_PORT, int, 8476)

    @staticmethod
    def detect() -> bool:
        from gpulayer.trainer.accelerators import XLAAccelerator
        return XLAAccelerator.is_available()

    def world_size(self) -> int:
        return _xr().world_size()

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return _xr().global_ordinal()

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return _xr().local_ordinal()

    def node_rank(self) -> int:
        import torch_xla.core.xla_env_vars as xenv
        from torch_xla.utils.utils import getenv_as
        return getenv_as(xenv.HOST_ORDINAL, int, 0)
