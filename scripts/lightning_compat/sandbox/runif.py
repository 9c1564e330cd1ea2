"""RunIf for the gpulayer side (placed as tests_pytorch/helpers/runif.py): skip unless this machine can run it.

Each condition is judged from the machine alone, as Lightning's RunIf judges it, so both sides skip the same
tests. Conditions this runner cannot provide skip with their name: GPUs, TPUs, MPS, standalone multi-process
launches, DeepSpeed, TensorRT. An unknown keyword skips too, naming it.
"""

import importlib.util
import re
import sys

import pytest
import torch


def _version(text):
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def _has(package):
    return importlib.util.find_spec(package) is not None


def _reasons(min_cuda_gpus=0, min_torch=None, max_torch=None, min_python=None, bf16_cuda=False, tpu=False,
             mps=None, skip_windows=False, standalone=False, deepspeed=False, dynamo=False, rich=False,
             omegaconf=False, psutil=False, sklearn=False, onnx=False, linux_only=False, onnxscript=False,
             tensorrt=False, **unknown):
    reasons = []
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if min_cuda_gpus and cuda < min_cuda_gpus:
        reasons.append(f"GPUs>={min_cuda_gpus}")
    if bf16_cuda and not (cuda and torch.cuda.is_bf16_supported()):
        reasons.append("CUDA device bf16")
    if min_torch and _version(torch.__version__) < _version(min_torch):
        reasons.append(f"torch>={min_torch}")
    if max_torch and _version(torch.__version__) >= _version(max_torch):
        reasons.append(f"torch<{max_torch}")
    if min_python and sys.version_info[:3] < _version(min_python):
        reasons.append(f"python>={min_python}")
    if tpu:
        reasons.append("TPU")
    mps_available = torch.backends.mps.is_available()
    if mps is True and not mps_available:
        reasons.append("MPS")
    if mps is False and mps_available:
        reasons.append("no MPS")
    if skip_windows and sys.platform == "win32":
        reasons.append("unix")
    if linux_only and not sys.platform.startswith("linux"):
        reasons.append("linux")
    if standalone:
        reasons.append("standalone (PL_RUN_STANDALONE_TESTS: a launch of its own)")
    if deepspeed:
        reasons.append("deepspeed")
    if tensorrt:
        reasons.append("tensorrt")
    if dynamo and sys.platform == "win32":
        reasons.append("torch.dynamo")
    for flag, package in ((rich, "rich"), (omegaconf, "omegaconf"), (psutil, "psutil"), (sklearn, "sklearn"),
                          (onnx, "onnx"), (onnxscript, "onnxscript")):
        if flag and not _has(package):
            reasons.append(package)
    reasons.extend(f"unknown RunIf condition {k}" for k in unknown)
    return reasons


def RunIf(**kwargs):
    reasons = _reasons(**kwargs)
    return pytest.mark.skipif(condition=bool(reasons), reason=f"Requires: [{' + '.join(reasons)}]")


# Lightning's marker for a gloo failure on Windows: never true on the platforms this runner supports.
_xfail_gloo_windows = pytest.mark.xfail(condition=sys.platform == "win32", reason="gloo on Windows", strict=False)
