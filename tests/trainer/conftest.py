"""Trainer test fixtures: no test may leave a process or a seed variable behind."""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from gpulayer.trainer.seed import SEED_ENV, SEED_WORKERS_ENV


@pytest.fixture(autouse=True)
def trainer_hygiene():
    """Per test: children it started are gone, seed env vars and global torch flags restored."""
    saved_env = {k: os.environ.get(k) for k in (SEED_ENV, SEED_WORKERS_ENV)}
    threads = torch.get_num_threads()
    cudnn_benchmark = torch.backends.cudnn.benchmark
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. a session-wide Redis stays
    yield
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = cudnn_benchmark
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in left:
        p.kill()
    assert not left, f"test leaked processes: {[(p.pid, ' '.join(p.cmdline()[:4])) for p in left]}"
