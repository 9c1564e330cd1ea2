"""Trainer test fixtures: no test may leave a process or a seed variable behind."""

from __future__ import annotations

import os

import pytest
import torch

from gpulayer.trainer.seed import SEED_ENV, SEED_WORKERS_ENV


@pytest.fixture(autouse=True)
def trainer_hygiene():
    """Per test: seed env vars and global torch flags restored. (Processes a test leaves behind are failed by
    tests/conftest.py's check, which knows the fleets still in use.)"""
    saved_env = {k: os.environ.get(k) for k in (SEED_ENV, SEED_WORKERS_ENV)}
    threads = torch.get_num_threads()
    cudnn_benchmark = torch.backends.cudnn.benchmark
    yield
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = cudnn_benchmark
