"""Lightning's ``lightning.pytorch.accelerators``: the device kinds and the registry ``Trainer(accelerator=)`` reads.

>>> from gpulayer.trainer.accelerators import AcceleratorRegistry
>>> sorted(AcceleratorRegistry.available_accelerators())
['cpu', 'cuda', 'mps', 'tpu']
"""

from gpulayer.trainer.accelerators.accelerator import Accelerator
from gpulayer.trainer.accelerators.cpu import CPUAccelerator
from gpulayer.trainer.accelerators.cuda import CUDAAccelerator, find_usable_cuda_devices
from gpulayer.trainer.accelerators.mps import MPSAccelerator
from gpulayer.trainer.accelerators.registry import _AcceleratorRegistry
from gpulayer.trainer.accelerators.xla import XLAAccelerator

AcceleratorRegistry = _AcceleratorRegistry()
for _cls in (CPUAccelerator, CUDAAccelerator, MPSAccelerator, XLAAccelerator):
    _cls.register_accelerators(AcceleratorRegistry)

__all__ = ["Accelerator", "AcceleratorRegistry", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator",
           "XLAAccelerator", "find_usable_cuda_devices"]
