"""What this machine offers: GPUs found without initialising CUDA in the worker.

CUDA must not be initialised in a process that later forks its pool, so the
worker asks ``nvidia-smi``, or a short-lived child process running torch.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys

from ..errors import ConfigError

_PROBE = ("import json, torch; n = torch.cuda.device_count(); "
          "print(json.dumps([torch.cuda.get_device_name(i) for i in range(n)]))")


def _nvidia_smi() -> list[str] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def _torch_probe() -> list[str]:
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return []


def visible_indices(total: int, env: str | None) -> list[int]:
    """Physical GPU indices this worker may use, honouring CUDA_VISIBLE_DEVICES. Pure."""
    if env is None:
        return list(range(total))
    picked = []
    for part in env.split(","):
        part = part.strip()
        if not part.isdigit():
            break  # UUIDs or MIG names: let CUDA interpret them; we keep the order
        if int(part) < total:
            picked.append(int(part))
    return picked


def detect_gpus(mode: str = "auto") -> tuple[list[int], list[str]]:
    """(physical indices, names) of the GPUs this worker serves. ``mode``: auto, on or off."""
    if mode not in ("auto", "on", "off"):
        raise ConfigError(f"--cuda must be auto, on or off, not {mode!r}")
    if mode == "off":
        return [], []
    names = _nvidia_smi()
    if names is None:
        names = _torch_probe() if (mode == "on" or glob.glob("/dev/nvidia[0-9]*")) else []
    idx = visible_indices(len(names), os.environ.get("CUDA_VISIBLE_DEVICES"))
    names = [names[i] for i in idx]
    if mode == "on" and not names:
        raise ConfigError("--cuda on, but this machine shows no GPU (nvidia-smi and torch found none); "
                          "check the driver, or start the worker with --cuda auto")
    return idx, names


def default_address() -> str:
    """The address other machines reach this one at: the one its default route uses."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks a route
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
