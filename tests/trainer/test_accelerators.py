"""``gpulayer.trainer.accelerators``: the registry, the CPU accelerator and how ``Trainer(accelerator=)`` uses them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpulayer.trainer import Trainer
from gpulayer.trainer.accelerators import (Accelerator, AcceleratorRegistry, CPUAccelerator, CUDAAccelerator,
                                           MPSAccelerator, find_usable_cuda_devices)
from gpulayer.trainer.errors import MisconfigurationException, TrainerConfigError


class CountingAccelerator(Accelerator):
    """A CPU-placed accelerator with three devices of its own."""

    def setup_device(self, device: torch.device) -> None:
        pass

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return {"custom": 1.0}

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: Any) -> int:
        return int(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("cpu")] * devices

    @staticmethod
    def auto_device_count() -> int:
        return 3

    @staticmethod
    def is_available() -> bool:
        return True


def test_registry_lists_the_builtin_kinds_and_builds_instances():
    assert {"cpu", "cuda", "mps"} <= AcceleratorRegistry.available_accelerators()
    assert isinstance(AcceleratorRegistry.get("cpu"), CPUAccelerator)
    assert isinstance(AcceleratorRegistry.get("mps"), MPSAccelerator)
    with pytest.raises(KeyError, match="not found in registry"):
        AcceleratorRegistry.get("nope")
    with pytest.raises(MisconfigurationException, match="already present"):
        AcceleratorRegistry.register("cpu", CPUAccelerator)


def test_registering_a_custom_accelerator_makes_its_name_accepted():
    AcceleratorRegistry.register("counting", CountingAccelerator, description="three CPU devices")
    try:
        trainer = Trainer(accelerator="counting", logger=False)
        assert isinstance(trainer.accelerator, CountingAccelerator)
        assert trainer.num_devices == 3
    finally:
        AcceleratorRegistry.remove("counting")
    assert "counting" not in AcceleratorRegistry.available_accelerators()


def test_cpu_accelerator_reports_psutil_figures():
    import psutil

    stats = CPUAccelerator().get_device_stats(torch.device("cpu"))
    assert set(stats) == {"cpu_vm_percent", "cpu_percent", "cpu_swap_percent"}
    assert 0 <= stats["cpu_vm_percent"] <= 100
    assert stats["cpu_swap_percent"] == pytest.approx(psutil.swap_memory().percent, abs=5)


def test_cpu_accelerator_devices():
    acc = CPUAccelerator()
    assert CPUAccelerator.is_available() and CPUAccelerator.auto_device_count() == 1
    assert acc.parse_devices("2") == 2
    assert acc.get_parallel_devices(2) == [torch.device("cpu")] * 2
    with pytest.raises(TypeError, match="int > 0"):
        acc.parse_devices(0)
    with pytest.raises(MisconfigurationException, match="Device should be CPU"):
        acc.setup_device(torch.device("meta"))


def test_accelerator_cpu_gives_a_cpu_accelerator():
    trainer = Trainer(accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.accelerator, CPUAccelerator)
    assert trainer.num_devices == 2


def test_an_accelerator_instance_is_used_as_given():
    mine = CountingAccelerator()
    trainer = Trainer(accelerator=mine, logger=False)
    assert trainer.accelerator is mine
    assert trainer.num_devices == 3  # devices="auto": its auto_device_count
    assert Trainer(accelerator=mine, devices=1, logger=False).num_devices == 1


def test_an_unknown_accelerator_is_refused_naming_the_choices():
    with pytest.raises(TrainerConfigError, match=r"accelerator='quantum'.*'auto', 'cpu', 'cuda', 'gpu'"):
        Trainer(accelerator="quantum", logger=False)
    with pytest.raises(TrainerConfigError, match="MPSAccelerator is registered"):
        Trainer(accelerator="mps", logger=False)


def test_cuda_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without one
    assert not CUDAAccelerator.is_available() and CUDAAccelerator.auto_device_count() == 0
    with pytest.raises(TrainerConfigError, match="not available.*'cpu'"):
        Trainer(accelerator="cuda", logger=False)
    assert find_usable_cuda_devices(0) == []
    with pytest.raises(ValueError, match="no visible CUDA devices"):
        find_usable_cuda_devices(1)


def test_gpu_without_a_backend_and_no_devices_are_refused(monkeypatch):
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: False))
    with pytest.raises(MisconfigurationException, match="No supported gpu backend found"):
        Trainer(accelerator="gpu", logger=False)
    for devices in (0, "0", []):
        with pytest.raises(MisconfigurationException, match="not a valid input using cpu accelerator"):
            Trainer(accelerator="cpu", devices=devices, logger=False)
