"""A CPU fit keeps freed step memory mapped: repeated big allocations stop faulting pages in."""

from __future__ import annotations

import platform
import resource
import sys

import pytest
import torch

from gpulayer.trainer import allocator


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_activation_sized_blocks_are_reused_without_page_faults():
    assert allocator.keep_freed_memory()

    def step() -> None:  # activations of a small CNN step: a few MB allocated and freed
        a = torch.ones(512 * 1024)
        b = a * 2
        c = torch.ones(256 * 1024)
        del a, b, c

    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 20 * 100, f"{faults} page faults in 20 steps of 4 MB (about 1,000 per step when unmapped)"
    allocator.release()
