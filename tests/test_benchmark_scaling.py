"""Smoke runs of ``benchmarks/lightning_comparison/scaling_run.py`` (the scaling and locality job): each trainer
once on tiny data, on loopback. The sweeps themselves are benchmarks (``scaling.py``, ``locality_run.py``)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from gpulayer.procs.env import free_port, torchrun_command
from tests.fleets import need, running_fleet

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "lightning_comparison" / "scaling_run.py"
RUN_TIMEOUT = 300


def check_stats(path: Path, steps: int) -> None:
    stats = json.loads(path.read_text())
    assert stats["steps"] == steps
    assert stats["first_step_at"] <= stats["last_step_at"]
    assert math.isfinite(stats["eval_loss"]) and math.isfinite(stats["last_loss"])


def test_the_gpulayer_client_fits_on_two_workers(tmp_path):
    stats = tmp_path / "stats.json"
    with running_fleet(tmp_path / "fleet", {"w1": dict(slots=2), "w2": dict(slots=2)}) as fleet:
        env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)
        # 256 images over 4 processes, 64 each: one step per epoch.
        out = subprocess.run([sys.executable, str(RUN), "--framework", "gpulayer", "--machines", "2", "--images", "256",
                              "--grad-sync", "two_level", "--workers", "w1,w2", "--stats", str(stats)],
                             env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("client ")][-1].removeprefix("client "))
    assert client["world_size"] == 4 and client["grad_sync"] == "two_level"
    assert sorted(client["workers"]) == ["w1", "w2"] and client["fit_s"] > 0
    check_stats(stats, steps=2)


def test_the_lightning_ranks_fit_under_torchrun(tmp_path):
    need(importlib.util.find_spec("lightning") is not None, "lightning is not installed (pip install lightning==2.6.6)")
    stats = tmp_path / "stats.json"
    target = [str(RUN), "--framework", "lightning", "--machines", "1", "--images", "256", "--stats", str(stats)]
    cmd = torchrun_command(1, 2, 0, "127.0.0.1", free_port(), target, log_dir=str(tmp_path / "torchrun"))
    out = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=RUN_TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    check_stats(stats, steps=2)  # 256 images over 2 processes, 128 each: one step per epoch
