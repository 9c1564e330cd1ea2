"""``MPSAccelerator``: Apple silicon's GPU (``torch.backends.mps``); one device at most."""

from __future__ import annotations

import platform
from typing import Any

import torch

from gpulayer.trainer.accelerators.accelerator import Accelerator
from gpulayer.trainer.errors import MisconfigurationException


def _mps_here() -> bool:
    return (platform.system() == "Darwin" and platform.processor() == "arm"
            and torch.backends.mps.is_available())


class MPSAccelerator(Accelerator):
    """Available only on an Apple silicon Mac with torch's MPS backend (so never on gpulayer's Linux workers)."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != "mps":
            raise MisconfigurationException(f"Device should be MPS, got {device} instead.")

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        from gpulayer.trainer.accelerators.cpu import get_cpu_stats
        return get_cpu_stats()  # MPS memory is the host's (unified memory)

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> list[int] | None:
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            devices = int(devices)
        if devices in (1, -1, [0]):
            return [0] if MPSAccelerator.is_available() else None
        if devices == 0:
            return None
        raise MisconfigurationException(f"`devices={devices!r}`: MPS offers one device (devices=1)")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("mps", i) for i in (devices or [])]

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return _mps_here()

    @staticmethod
    def name() -> str:
        return "mps"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register("mps", cls, description=cls.__name__)
