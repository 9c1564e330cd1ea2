"""Copy-ahead: a no-op on CPU; on CUDA the batches arrive on the device, in order, unchanged."""

from __future__ import annotations

import pytest
import torch

from gpulayer.trainer.prefetch import CudaPrefetcher, device_batches


def _batches():
    return [(torch.full((4, 3), float(i)), {"y": torch.tensor([i])}) for i in range(5)]


def test_cpu_batches_pass_through_untouched():
    source = iter(_batches())
    assert device_batches(source, torch.device("cpu"), prefetch=True) is source


@pytest.mark.cuda  # deselected by default; `pytest -m cuda` on a GPU machine
def test_cuda_copy_ahead_keeps_order_and_values():
    device = torch.device("cuda", 0)
    out = list(CudaPrefetcher(iter(_batches()), device))
    assert len(out) == 5
    for i, (x, d) in enumerate(out):
        assert x.device == device and d["y"].device == device
        assert torch.equal(x.cpu(), torch.full((4, 3), float(i))) and d["y"].item() == i
