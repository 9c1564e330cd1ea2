"""``Accelerator``: the kind of device a Trainer runs on (Lightning's ``lightning.pytorch.accelerators.Accelerator``).

An accelerator answers what the Trainer asks of a device kind: is it here (``is_available``), how many
(``auto_device_count``), what a ``devices=`` argument means (``parse_devices``), which ``torch.device`` objects
the ranks use (``get_parallel_devices``), how to make one current (``setup_device``) and what it reports
(``get_device_stats``). ``Trainer(accelerator=...)`` takes a registered name or an instance of a subclass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class Accelerator(ABC):
    """Base class of the device kinds; subclasses implement the abstract methods (static ones are per kind)."""

    @abstractmethod
    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current one of this process (raise if it is not of this kind)."""

    @abstractmethod
    def teardown(self) -> None:
        """Release what this accelerator holds at the end of a run."""

    def setup(self, trainer: Any) -> None:
        """Prepare the accelerator for ``trainer``'s run (nothing by default)."""

    @staticmethod
    @abstractmethod
    def parse_devices(devices: Any) -> Any:
        """What ``Trainer(devices=...)`` means for this kind: a count or a list of indices."""

    @staticmethod
    @abstractmethod
    def get_parallel_devices(devices: Any) -> Any:
        """The devices the ranks use, from what ``parse_devices`` returned."""

    @staticmethod
    @abstractmethod
    def auto_device_count() -> int:
        """How many devices ``devices="auto"`` means."""

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this kind of device is usable on this machine."""

    @abstractmethod
    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Statistics of ``device`` (what ``DeviceStatsMonitor`` logs)."""

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Add this class to ``accelerator_registry`` under its names (a custom class may do so too)."""
