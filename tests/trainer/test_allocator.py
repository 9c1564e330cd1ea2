"""A CPU fit keeps freed step memory mapped: repeated big allocations stop faulting pages in."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

# Runs in a fresh interpreter: the heap of the test process carries whatever earlier tests left in it.
_PROBE = """
import json, resource, torch
from gpulayer.trainer import allocator

took = allocator.keep_freed_memory()

def step():  # activations of a small CNN step: a few MB allocated and freed
    a = torch.ones(512 * 1024)
    b = a * 2
    c = torch.ones(256 * 1024)
    del a, b, c

for _ in range(50):  # the heap grows to the step's peak (small objects settle between the big blocks)
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
allocator.release()
print(json.dumps({"took": took, "faults": faults}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_activation_sized_blocks_are_reused_without_page_faults():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["took"]
    # Unmapped, each step faults its 5 MB back in: about 1,250 faults a step, 62,000 in 50 steps.
    assert probe["faults"] < 50 * 100, f"{probe['faults']} page faults in 50 warm steps of 5 MB"

