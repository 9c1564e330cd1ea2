"""A job that crashes its process fails alone; the worker and its other slots carry on."""

from __future__ import annotations

import os

import pytest

import gpulayer
from gpulayer import JobFailed, Resources, submit


def hard_exit():
    os._exit(7)


def segfault():
    import ctypes

    ctypes.string_at(0)


def slow(x):
    import time

    time.sleep(1.0)
    return x


def worker_pid():
    return gpulayer.current_worker().pid


@pytest.mark.parametrize("crash, sign", [(hard_exit, "exitcode 7"), (segfault, "SIGSEGV")])
def test_crashing_job_fails_alone(fleet, crash, sign):
    pin = Resources(worker_ids=["w-a"])  # two slots: one crashes, one runs a neighbour
    pid_before = submit.delay(worker_pid, resources=pin).get(timeout=30)
    neighbour = submit.delay(slow, 5, resources=pin)
    with pytest.raises(JobFailed) as e:
        submit.delay(crash, resources=pin).get(timeout=60)
    assert e.value.type_name == "WorkerLostError"
    assert sign in e.value.message and "process died" in e.value.message
    assert neighbour.get(timeout=60) == 5
    # The same worker (same main process) takes the next job.
    assert submit.delay(worker_pid, resources=pin).get(timeout=30) == pid_before
    assert fleet.workers["w-a"].poll() is None
