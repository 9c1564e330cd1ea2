"""``distributed``: one job made of N workers x M processes (DDP), started with torchrun's environment.

>>> def allreduce_rank():
...     import torch, torch.distributed as dist
...     gpulayer.init_process_group("gloo")
...     t = torch.tensor([float(dist.get_rank())]); dist.all_reduce(t); return t.item()
>>> job = distributed(allreduce_rank, nodes=2, procs_per_node=2)
>>> job.placement.reason
'placed on 2 workers in zone europe-west1-b'
>>> job.get()
[6.0, 6.0, 6.0, 6.0]
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable

from celery.exceptions import TimeoutError as CeleryTimeout

from .. import app as app_mod
from .. import signing
from ..client import ensure_connected
from ..errors import GangFailed, JobFailed, JobRejected
from ..models import GangPlacement, GangSpec, GangState, Resources
from ..payload import function_name, pack_function
from ..placement import check_gang_fits_fleet
from ..store.gangs import GangStore
from .coordinator import coordinate
from .ranks import first_failure
from ..tasks.submit import as_resources

RETRY_EVERY = 0.2  # seconds between placement attempts while a gang waits for slots
COORDINATOR_WAIT = 1.0  # seconds to wait for a worker to run the coordinator before running it here


def init_process_group(backend: str | None = None, **kwargs):
    """``torch.distributed.init_process_group`` from the environment gpulayer (or torchrun) set.

    ``backend`` defaults to nccl when CUDA is available, else gloo.
    """
    import torch
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, **kwargs)
    return dist.group.WORLD


def distributed(fn: Callable | str, *args, nodes: int = 1, procs_per_node: int = 1,
                resources: Resources | dict | None = None, backend: str = "gloo", launcher: str = "direct",
                timeout: float | None = None, max_restarts: int = 0, warm: bool = True, **kwargs) -> GangHandle:
    """Run ``fn(*args, **kwargs)`` in every rank of a ``nodes`` x ``procs_per_node`` gang.

    All slots are reserved at once; a gang that can never fit on the live fleet
    raises ``JobRejected`` now; one that does not fit yet waits (its reason in
    ``handle.status()``) up to ``timeout`` seconds. ``fn`` calls
    ``torch.distributed.init_process_group`` itself, as under torchrun.
    With the direct launcher, ranks fork from each worker's warm template
    (torch already imported); ``warm=False`` (or ``GPULAYER_WARM_RANKS=0`` on
    the worker) starts fresh interpreters instead.
    """
    ensure_connected()
    try:
        spec = GangSpec(gang_id=uuid.uuid4().hex, nodes=nodes, procs_per_node=procs_per_node,
                        resources=as_resources(resources), backend=backend, launcher=launcher, timeout=timeout,
                        max_restarts=max_restarts, warm=warm,
                        name=function_name(fn) if not isinstance(fn, str) else fn)
    except ValueError as err:
        raise ValueError(f"invalid distributed job: {err}") from err
    check_gang_fits_fleet(spec, app_mod.registry().snapshot())
    payload = signing.dumps((pack_function(fn), args, kwargs))
    client = app_mod.redis_client()
    GangStore(client).create(spec, payload)
    return GangHandle(spec, client)


class GangHandle:
    """A running distributed job: ``placement``, ``status()``, ``get()``, ``cancel()``."""

    def __init__(self, spec: GangSpec, client):
        self.spec = spec
        self.id = spec.gang_id
        self.store = GangStore(client)
        self.attempt = 0
        self._placed = threading.Event()
        self._done = threading.Event()
        self._placement: GangPlacement | None = None
        self._result: list[Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drive, name=f"gang-{self.id[:8]}", daemon=True)
        self._thread.start()

    # -- public ----------------------------------------------------------------------------------
    @property
    def placement(self) -> GangPlacement:
        """The workers chosen (index = node rank) and why; waits until the gang is placed."""
        while not self._placed.wait(0.05):
            if self._done.is_set():
                break
        if self._placement is None:
            raise self._error or JobFailed("GangNotPlaced", "the gang ended before it was placed", job_id=self.id)
        return self._placement

    def status(self) -> dict:
        """The gang's record: state, reason (why it waits, or where it runs), attempt, placement."""
        return self.store.record(self.id)

    def get(self, timeout: float | None = None) -> list[Any]:
        """Per-rank return values (index = rank), or ``JobFailed`` naming the failed rank."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"distributed job {self.id} still {self.status()['state']} after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self) -> None:
        """Stop every rank everywhere and free the slots."""
        self.store.cancel(self.id)
        self._done.wait(30)

    # -- the driver ------------------------------------------------------------------------------
    def _drive(self) -> None:
        try:
            while True:
                if not self._place():
                    return
                outcome = self._wait_attempt()
                if outcome == "succeeded":
                    self._wait_nodes_stopped()  # get() returns once every slot is free again
                    self.store.finish(self.id, GangState.SUCCEEDED, self._placement.reason)
                    return
                if outcome == "cancelled":
                    self._error = JobFailed("Cancelled", f"distributed job {self.id} was cancelled", job_id=self.id)
                    return
                self._wait_nodes_stopped()  # every node's failure reports are in before one is named
                error = self._failure()
                if self.attempt >= self.spec.max_restarts:
                    self.store.finish(self.id, GangState.FAILED, error.message)
                    self._error = error
                    return
                self.attempt += 1  # restart the whole gang, like torchrun
                self.store.set_waiting(self.id, f"restarting after: {error.message}")
                self._placed.clear()
        except BaseException as err:  # never leave a waiter hanging
            self._error = err
        finally:
            self._done.set()
            self._placed.set()

    def _place(self) -> bool:
        deadline = None if self.spec.timeout is None else time.monotonic() + self.spec.timeout
        queued = None
        while True:
            state = self.store.state(self.id)
            if state == GangState.CANCELLED:
                self._error = JobFailed("Cancelled", f"distributed job {self.id} was cancelled", job_id=self.id)
                return False
            queued = queued or coordinate.delay(self.id, self.attempt)
            try:
                out = queued.get(timeout=COORDINATOR_WAIT)
                queued = None
            except CeleryTimeout:  # no worker has a free slot for it: run the same step here
                out = coordinate.apply((self.id, self.attempt)).get()
            if out["state"] == "running" and "placement" not in out:  # placed by the other coordinator
                out["placement"] = self.status()["placement"]
            if out["state"] != "waiting" and queued is not None:
                # The queued coordinator will find the gang placed and do nothing; stop listening for it.
                queued.backend.remove_pending_result(queued)
                queued = None
            if out["state"] == "running":
                self._placement = GangPlacement.model_validate(out["placement"])
                self._placed.set()
                return True
            if out["state"] == "failed":
                self._error = JobRejected(out["reason"])
                return False
            if out["state"] != "waiting":
                self._error = JobFailed("GangState", f"unexpected gang state {out['state']}", job_id=self.id)
                return False
            if deadline is not None and time.monotonic() > deadline:
                reason = out.get("reason", "")
                self.store.finish(self.id, GangState.FAILED, f"timed out waiting: {reason}")
                self._error = JobRejected(f"distributed job {self.id} did not fit within {self.spec.timeout}s: "
                                          f"{reason}")
                return False
            time.sleep(RETRY_EVERY)

    def _wait_attempt(self) -> str:
        world = self.spec.world_size
        while True:
            if self.store.state(self.id) == GangState.CANCELLED:
                self._wait_nodes_stopped()
                return "cancelled"
            if self.store.failures(self.id, self.attempt):
                return "failed"
            results = self.store.results(self.id, self.attempt)
            if len(results) == world:
                self._result = [signing.loads(results[r]) for r in range(world)]
                return "succeeded"
            time.sleep(0.01)

    def _wait_nodes_stopped(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.store.nodes(self.id, self.attempt)) < self.spec.nodes and time.monotonic() < deadline:
            time.sleep(0.02)

    def _failure(self) -> JobFailed:
        reports = self.store.failures(self.id, self.attempt)
        # The earliest failure that is not a rank losing its connection to the rank that really failed.
        first = first_failure(reports)
        rank = first["rank"]
        mine = [r for r in reports if r.get("rank") == rank]
        exc = next((r for r in mine if r["kind"] == "exception"), None)
        exit_code = next((r["exit_code"] for r in mine if r.get("exit_code") is not None), None)
        tail = max((r.get("stderr_tail") or "" for r in mine), key=len)
        where = f"{first.get('worker')} ({first.get('address') or first.get('host')})"
        if exc:
            what = f"{exc['type']}: {exc['message']}"
            type_name = exc["type"]
        elif first["kind"] == "worker_lost":
            what, type_name = first["message"], "WorkerLost"
        else:
            what = first.get("message") or "the process died"
            type_name = "RankExited"
        code = f", exit code {exit_code}" if exit_code is not None else ""
        message = f"rank {rank} on {where} failed{code}: {what}"
        detail = (exc or {}).get("traceback") or ""
        if tail:
            detail += f"\n--- last lines of rank {rank}'s stderr ---\n{tail}"
        err = GangFailed(type_name, message, detail or None, job_id=self.id, worker=first.get("worker"))
        err.rank, err.exit_code = rank, exit_code
        return err
