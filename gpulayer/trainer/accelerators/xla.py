"""``XLAAccelerator``: TPUs through ``torch_xla``, named so that ``accelerator="tpu"`` is known; gpulayer does not
run fits on XLA, so it is available only where ``torch_xla`` is installed and refused by the Trainer."""

from __future__ import annotations

from typing import Any

import torch

from gpulayer.trainer.accelerators.accelerator import Accelerator
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.utilities.imports import _available


class XLAAccelerator(Accelerator):
    def setup_device(self, device: torch.device) -> None:
        raise MisconfigurationException("gpulayer's Trainer does not run on XLA devices")

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return {}

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> list:
        return []

    @staticmethod
    def auto_device_count() -> int:
        return 0

    @staticmethod
    def is_available() -> bool:
        return _available("torch_xla")

    @staticmethod
    def name() -> str:
        return "tpu"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register("tpu", cls, description=cls.__name__)
