"""CPU fits: keep freed memory in the process between steps, as the CUDA caching allocator does on GPUs.

PyTorch's CPU tensors come from glibc's ``malloc``. With its defaults a step's
big activations are returned to the kernel when freed (``munmap``, or a trim of
the heap top) and faulted back in, page by page, by the next step: a small CNN
at batch 32 took ~3,400 page faults per step, a quarter of its time on two
cores. Raising the mmap and trim thresholds keeps those pages mapped; the
process holds its peak step memory, which the next step needs anyway.
``release`` hands the free memory back when the fit ends.
"""

from __future__ import annotations

import ctypes
import platform
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20     # glibc's largest accepted value on 64-bit; bigger blocks are mmapped
_TRIM_THRESHOLD = 1 << 30      # free heap top kept before it is given back


def _libc():
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None  # musl, macOS, Windows: their allocators have no such knobs
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Stop glibc from unmapping freed step memory; True when it took effect."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def return_freed_memory() -> bool:
    """glibc's own thresholds again (128 KiB): big blocks are mapped and unmapped one by one. For a sharded fit,
    whose all-gathered layers come and go in turn, a kept heap would hold them all, fragmented."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, 128 << 10)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 128 << 10))


def release() -> None:
    """Give free heap memory back to the kernel (end of fit)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
