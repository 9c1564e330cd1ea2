"""``CUDAAccelerator``: NVIDIA GPUs through ``torch.cuda``; ``find_usable_cuda_devices`` picks free ones."""

from __future__ import annotations

from typing import Any

import torch

from gpulayer.trainer.accelerators.accelerator import Accelerator
from gpulayer.trainer.errors import MisconfigurationException


def num_cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _gpu_ids(devices: Any) -> list[int] | None:
    """``devices=`` for GPUs: N (the first N), -1 (all), a list of indices, or their string forms; 0: None."""
    if isinstance(devices, str):
        text = devices.strip()
        if text == "-1":
            devices = -1
        elif "," in text:
            devices = [int(x) for x in text.split(",") if x.strip()]
        elif text.isdigit():
            devices = int(text)
        else:
            raise MisconfigurationException(f"Invalid `devices={devices!r}`: an int, -1, a list of GPU indices or a "
                                            "string of them ('0,1')")
    count = num_cuda_devices()
    if isinstance(devices, bool) or devices is None:
        raise MisconfigurationException(f"Invalid `devices={devices!r}` for the CUDA accelerator")
    if isinstance(devices, int):
        if devices < -1:
            raise MisconfigurationException(f"Invalid `devices={devices}`: use a positive int or -1 (all GPUs)")
        if devices == 0:
            return None
        devices = list(range(count)) if devices == -1 else list(range(devices))
    ids = list(devices)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise MisconfigurationException(f"Invalid `devices={devices!r}`: GPU indices are non-negative ints")
    if any(i >= count for i in ids):
        raise MisconfigurationException(f"You requested gpu: {ids}\n But your machine only has: {list(range(count))}")
    return ids


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """The indices of ``num_devices`` CUDA GPUs this process can allocate on (-1: all such), for ``devices=``.

    A GPU is usable if a tensor can be placed on it; one held exclusively by another process is skipped.
    Two processes asking at once may both pick the same free GPU.
    """
    if num_devices == 0:
        return []
    visible = list(range(num_cuda_devices()))
    if not visible:
        raise ValueError(f"You requested to find {num_devices} devices but there are no visible CUDA devices on "
                         "this machine.")
    if num_devices > len(visible):
        raise ValueError(f"You requested to find {num_devices} devices but this machine only has {len(visible)} GPUs.")
    usable, busy = [], []
    for index in visible:
        try:
            torch.tensor(0, device=torch.device("cuda", index))
        except RuntimeError:
            busy.append(index)
            continue
        usable.append(index)
        if len(usable) == num_devices:
            break
    if num_devices != -1 and len(usable) != num_devices:
        raise RuntimeError(f"You requested to find {num_devices} devices but only {len(usable)} are currently "
                           f"available. The devices {busy} are occupied by other processes and can't be used at the "
                           "moment.")
    return usable


class CUDAAccelerator(Accelerator):
    """GPUs by index; ``devices="auto"`` means all of them."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise MisconfigurationException(f"Device should be GPU, got {device} instead")
        torch.cuda.set_device(device)

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """``torch.cuda.memory_stats`` of ``device``: the caching allocator's counters."""
        return dict(torch.cuda.memory_stats(device))

    def teardown(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> list[int] | None:
        return _gpu_ids(devices)

    @staticmethod
    def get_parallel_devices(devices: list[int]) -> list[torch.device]:
        return [torch.device("cuda", i) for i in devices]

    @staticmethod
    def auto_device_count() -> int:
        return num_cuda_devices()

    @staticmethod
    def is_available() -> bool:
        return num_cuda_devices() > 0

    @staticmethod
    def name() -> str:
        return "cuda"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register("cuda", cls, description=cls.__name__)
