"""``CPUAccelerator``: the host's CPU; ``devices=M`` means M processes on it."""

from __future__ import annotations

from typing import Any

import torch

from gpulayer.trainer.accelerators.accelerator import Accelerator
from gpulayer.trainer.errors import MisconfigurationException

_CPU_VM_PERCENT = "cpu_vm_percent"
_CPU_PERCENT = "cpu_percent"
_CPU_SWAP_PERCENT = "cpu_swap_percent"


def get_cpu_stats() -> dict[str, float]:
    """Host memory, CPU and swap use in percent, read from ``psutil`` (needed: ``pip install psutil``)."""
    try:
        import psutil
    except ImportError as err:
        raise ModuleNotFoundError("Fetching CPU device stats requires `psutil` to be installed. "
                                  "Install it by running `pip install -U psutil`.") from err
    return {_CPU_VM_PERCENT: psutil.virtual_memory().percent, _CPU_PERCENT: psutil.cpu_percent(),
            _CPU_SWAP_PERCENT: psutil.swap_memory().percent}


def _parse_cpu_cores(devices: Any) -> int:
    """A positive int, or a string of one: the number of processes."""
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices <= 0:
        raise TypeError("`devices` selected with `CPUAccelerator` should be an int > 0.")
    return devices


class CPUAccelerator(Accelerator):
    """Always available; one device by default."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise MisconfigurationException(f"Device should be CPU, got {device} instead.")

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return get_cpu_stats()

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: int | str) -> int:
        return _parse_cpu_cores(devices)

    @staticmethod
    def get_parallel_devices(devices: int | str) -> list[torch.device]:
        return [torch.device("cpu")] * _parse_cpu_cores(devices)

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def name() -> str:
        return "cpu"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register("cpu", cls, description=cls.__name__)
