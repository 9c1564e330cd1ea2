"""What a running job can see of where it runs, and the GPUs it was given.

Set up in the worker's main process before the pool forks, so every pool
process inherits it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ..models import WorkerInfo

_worker: WorkerInfo | None = None
_gpu_owners = None  # multiprocessing.Array of pids, one per GPU; 0 = free
_gpu_ids: list[int] = []  # physical indices, in the order of _gpu_owners
registry = None  # the worker's Registry, for its bootsteps (set by worker.main)


@dataclass(frozen=True)
class JobContext:
    job_id: str | None
    worker: WorkerInfo
    gpus: tuple[int, ...]


_context: JobContext | None = None


def install(worker: WorkerInfo, gpu_ids: list[int] | None = None) -> None:
    """Called once in the worker's main process, before the pool starts."""
    global _worker, _gpu_owners, _gpu_ids
    _worker = worker
    _gpu_ids = list(gpu_ids or range(worker.gpus))
    _gpu_owners = mp.Array("i", worker.gpus) if worker.gpus else None


def current_worker() -> WorkerInfo | None:
    """The worker running this code, or None outside a worker."""
    return _worker


def current_job() -> JobContext | None:
    """The running job's id, worker and GPUs, or None outside a job."""
    return _context


def pick_gpus(owners: list[int], n: int, alive) -> list[int] | None:
    """Indices of ``n`` GPUs that are free or held by a dead process; None if too few. Pure."""
    free = [i for i, pid in enumerate(owners) if pid == 0 or not alive(pid)]
    return free[:n] if len(free) >= n else None


def pid_alive(pid: int) -> bool:
    """Is ``pid`` a live process on this machine?"""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@contextmanager
def job_scope(job_id: str | None, gpus: int):
    """Run a job with its context set and, for CUDA jobs, only its GPUs visible."""
    global _context
    given: list[int] = []
    saved = None
    if gpus and _gpu_owners is not None:
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")  # only a CUDA job reads or sets it
        while True:
            with _gpu_owners.get_lock():
                given = pick_gpus(list(_gpu_owners), gpus, pid_alive) or []
                for i in given:
                    _gpu_owners[i] = os.getpid()
            if given:
                break
            time.sleep(0.05)  # every GPU is busy with other jobs on this worker: wait for one
        physical = tuple(_gpu_ids[i] for i in given)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, physical))
    else:
        physical = ()
    _context = JobContext(job_id, _worker, physical) if _worker else None
    try:
        yield _context
    finally:
        _context = None
        if given:
            with _gpu_owners.get_lock():
                for i in given:
                    _gpu_owners[i] = 0
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
