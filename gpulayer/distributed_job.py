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

import logging
import os
import threading
import uuid
from typing import Any, Callable

from pydantic import ValidationError

from . import app as app_mod
from . import remote_errors, signing
from .client import ensure_connected
from .deadline import Deadline
from .errors import ClusterUnavailable, InvalidRequest, JobFailed, JobRejected, JobTimeout
from .session import BROKER_ERRORS, broker_lost, outage
from .models import GangPlacement, GangSpec, GangState, Resources, describe_invalid
from .payload import function_name, pack_function
from .placement import check_gang_fits_fleet
from .procs.env import BACKEND_ENV
from .store import keys
from .store.gangs import FIRST_REASON, GangStore
from .store.reconcile import RECONCILE_WAIT, switched_within
from .gang import attempts
from .gang.coordinator import ask
from .gang.workdir import ShippedDir
from .output import tail, watch
from .tasks.submit import as_resources, output_header
from .workspace import shipping

log = logging.getLogger(__name__)
PLACEMENT_LOOK = 0.25  # seconds between reads of a waiting gang's reason (wait_placement)
LOOK_EVERY = 1.0  # seconds between reads of the gang's record when no event arrives (a missed one)
NO_COORDINATOR_GRACE = 30.0  # past its timeout by this much, a gang no coordinator ended is ended by its client


def init_process_group(backend: str | None = None, **kwargs):
    """``torch.distributed.init_process_group`` from the environment gpulayer (or torchrun) set.

    ``backend`` defaults to the job's (``distributed(backend=...)``, which its ranks find in
    ``GPULAYER_BACKEND``); outside such a job, to nccl when CUDA is available, else gloo.
    """
    import torch
    import torch.distributed as dist

    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or ("nccl" if torch.cuda.is_available() else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(backend, **kwargs)
    return dist.group.WORLD


def distributed(fn: Callable | str, *args, nodes: int = 1, procs_per_node: int = 1,
                resources: Resources | dict | None = None, backend: str = "gloo", launcher: str = "direct",
                timeout: float | None = None, max_restarts: int = 0, warm: bool = True, priority: int = 0,
                workdir: ShippedDir | None = None, on_output: OutputFn | None = None, working_dir=None,
                py_modules=None, excludes=None, runtime_env: dict | None = None, **kwargs) -> GangHandle:
    """Run ``fn(*args, **kwargs)`` in every rank of a ``nodes`` x ``procs_per_node`` gang.

    All slots are reserved at once; a gang that can never fit on the live fleet
    raises ``JobRejected`` now; one that does not fit yet waits in the cluster's
    line (its reason in ``handle.status()``) up to ``timeout`` seconds, and is
    placed when slots come free even if this process has exited. ``fn`` calls
    ``torch.distributed.init_process_group`` itself, as under torchrun, or
    ``gpulayer.init_process_group()``, whose default is ``backend`` (``"gloo"``, or
    ``"nccl"``, which needs ``resources`` with CUDA and is refused without).
    ``on_output(rank, stream, line)`` gets every line the ranks print, from the
    first (subscribed before the gang can start); ``get()`` returns after the last.
    Without it, the ranks' lines are printed here as they come, ``(rank 2 on w-b) line``
    (``log_to_client``, as for jobs); ``handle.logs(rank=R)`` reads the lines each rank kept.
    ``workdir`` (what ``gpulayer train`` ships): every node's agent unpacks it once
    and its ranks run in it (``gpulayer/gang/workdir.py``); a restarted attempt starts
    on every node from node 0's files at the end of the failed one, as on a shared
    file system (``ShippedDir(..., restart_from="own")``: each worker's own directory;
    ``"fresh"``: the shipped copy). ``handle.on_restart(fn)`` and ``handle.status()``
    tell each restart and why.
    ``priority`` (0 to 9, higher wins; 0, the default, is the lowest): a waiting gang is placed before
    those of lower priority, and one that does not fit preempts running gangs of lower priority that
    have run ``preempt_min_runtime`` seconds: their ranks get SIGTERM, SIGKILL after ``preempt_grace``
    seconds, and each is requeued whole, its restarts untouched (docs/DISTRIBUTED.md).
    With the direct launcher, ranks fork from each worker's warm template
    (torch already imported); ``warm=False`` (or ``GPULAYER_WARM_RANKS=0`` on
    the worker) starts fresh interpreters instead.
    """
    ensure_connected()
    options = {k: v for k, v in (("working_dir", working_dir), ("py_modules", py_modules),
                                 ("excludes", excludes), ("runtime_env", runtime_env)) if v is not None}
    if workdir is not None and options:
        raise ValueError(f"distributed(): workdir= (a ShippedDir, gpulayer train's) is the job's code already; "
                         f"drop {', '.join(f'{k}=' for k in options)}")
    try:
        if workdir is not None:  # `gpulayer train`: its working directory is its code, shipped the same way
            code = shipping.upload(app_mod.app.backend.client, workdir.code())
        else:
            code = shipping.digest_for(lambda: app_mod.app.backend.client, options)  # uploaded once
    except BROKER_ERRORS as err:
        raise broker_lost(err, "the distributed job was not started") from err
    try:
        spec = GangSpec(gang_id=uuid.uuid4().hex, nodes=nodes, procs_per_node=procs_per_node,
                        resources=as_resources(resources), backend=backend, launcher=launcher, timeout=timeout,
                        max_restarts=max_restarts, warm=warm, priority=priority,
                        name=function_name(fn) if not isinstance(fn, str) else fn,
                        workdir=workdir.spec() if workdir is not None else None, client=app_mod.client_identity(),
                        output=watch.output_id(force=True) if on_output is not None else output_header(app_mod.app),
                        code=code)
    except ValidationError as err:  # distributed()'s own keywords (the spec's fields): in one line
        raise InvalidRequest(describe_invalid(GangSpec, err, name="distributed"),
                             err.errors(include_url=False)) from None
    payload = signing.dumps((pack_function(fn), args, kwargs))
    try:
        check_gang_fits_fleet(spec, app_mod.registry().current())  # incremental: a submit never pays the full read
        client = app_mod.redis_client()
        handle = GangHandle(spec, client, on_output, start=False)  # its lines' route set before the gang exists
        GangStore(client).create(spec, payload)
        handle._begin()
        return handle
    except BROKER_ERRORS as err:
        raise broker_lost(err, f"distributed job {spec.gang_id} was not started") from err


def cancel_gang(gang_id: str, timeout: float = 30.0) -> dict | None:
    """Cancel distributed job ``gang_id`` from anywhere (``gpulayer cancel``, Ctrl-C in ``gpulayer train``), as
    ``GangHandle.cancel()`` does, and wait up to ``timeout`` seconds until every node of its attempt reported its
    ranks stopped. None when Redis has no such gang; else its record (``state`` as it was before, ``spec``,
    ``placement``) with ``cancelled`` (False: it had ended already) and ``left`` (nodes not yet stopped)."""
    ensure_connected()
    store = GangStore(app_mod.app.backend.client)
    rec = store.record(gang_id)
    if rec["state"] is None:
        return None
    rec.update(cancelled=False, left=0)
    if rec["state"] not in (GangState.WAITING.value, GangState.RUNNING.value):
        return rec
    events = store.r.pubsub(ignore_subscribe_messages=True)
    try:
        events.subscribe(keys.gang_events(gang_id))  # before the cancel: no node's "stopped" can be missed
        store.cancel(gang_id)
        rec["cancelled"] = True
        now = store.record(gang_id)  # a coordinator may have placed it between the first read and the cancel
        placement = now.get("placement") or rec.get("placement")
        if placement:
            rec["placement"], attempt, nodes = placement, now["attempt"], len(placement["workers"])
            deadline = Deadline(timeout)
            while len(store.nodes(gang_id, attempt)) < nodes and not deadline.expired():
                events.get_message(timeout=deadline.left(LOOK_EVERY))
            rec["left"] = nodes - len(store.nodes(gang_id, attempt))
    finally:
        events.close()
    return rec


OutputFn = Callable[[int, str, str], None]  # (rank, "stdout" | "stderr", line)
OUTPUT_QUIET = 0.2  # seconds without a line for on_output, once the gang has ended, before its output is over


class GangHandle:
    """A running distributed job: ``placement``, ``status()``, ``get()``, ``cancel()``.

    The cluster owns the gang: its coordinator places it, restarts it (``max_restarts``)
    and ends it, whether or not this handle is still there. The handle only watches:
    it wakes on the gang's events channel (placed, waiting, stopped, done) and reads
    the record.
    """

    def __init__(self, spec: GangSpec, client, on_output: OutputFn | None = None, start: bool = True):
        self.spec = spec
        self.id = spec.gang_id
        self.store = GangStore(client)
        self.attempt = 0
        self._placed = threading.Event()
        self._done = threading.Event()
        self._placement: GangPlacement | None = None
        self._result: list[Any] | None = None
        self._error: BaseException | None = None
        self._listening = threading.Event()
        self._restarts: list[tuple[dict, str]] = []  # (attempt entry, announcement) of each attempt restarted
        self._restart_seen = 0  # restarts before this attempt number have been told to the listeners
        self._restart_listeners: list[Callable[[dict, str], None]] = []
        self._restart_lock = threading.Lock()
        self._output = on_output is not None
        # The watcher's view of a lost broker: it rides out a restart, and get() says so when it gives up.
        self._lost = outage(None, f"distributed job {self.id} was started; the cluster runs it whether or not anyone "
                                  "watches, and its record waits in Redis if the broker comes back with its data")
        if on_output is not None:  # before the gang can start: warm ranks print within milliseconds
            watch.route(self.id, lambda source, stream, line: on_output(
                source.rank, "stdout" if stream == "out" else "stderr", line))
        self._thread = threading.Thread(target=self._drive, name=f"gang-{self.id[:8]}", daemon=True)
        if start:
            self._begin()

    def _begin(self) -> None:
        """Watch the gang (created in Redis by now) and ask a coordinator to place it."""
        self._thread.start()
        self._listening.wait(30)  # subscribed before the coordinator is asked: no event can be missed
        ask(self.id, 0)

    # -- public ----------------------------------------------------------------------------------
    @property
    def placement(self) -> GangPlacement:
        """The workers chosen (index = node rank) and why; waits until the gang is placed, with no limit.

        While it waits for slots, the reason is logged (logger ``gpulayer.distributed_job``, WARNING: shown
        on stderr unless logging is set up otherwise) each time it changes, e.g. ``distributed job 3f2a...
        is not placed yet: waiting for 2 workers with 2 free slots ... (#1 in line)``. ``wait_placement(timeout)``
        gives up after ``timeout`` seconds instead.
        """
        return self.wait_placement(None, on_waiting=lambda why: log.warning(
            "distributed job %s is not placed yet: %s", self.id, why))

    def wait_placement(self, timeout: float | None = None,
                       on_waiting: Callable[[str], None] | None = None) -> GangPlacement:
        """``placement`` within ``timeout`` seconds, else ``JobTimeout`` saying why the gang still waits (it
        waits on in the cluster's line: call again, or ``cancel()``). ``on_waiting(reason)`` is called with
        the reason it waits (``waiting_for()``) each time that changes."""
        deadline = Deadline(timeout)
        told = None
        while not self._placed.wait(deadline.left(PLACEMENT_LOOK)):
            if self._done.is_set():
                break
            why = None
            if on_waiting is not None or deadline.expired():
                try:
                    why = self.waiting_for()
                except ClusterUnavailable:  # the watcher rides out a broker restart; the reason comes back with it
                    pass
            if why and why != told and on_waiting is not None:
                told = why
                on_waiting(why)
            if deadline.expired():
                raise JobTimeout(f"distributed job {self.id} was not placed within {timeout:g} s: "
                                 f"{why or 'waiting'}; it waits on in the cluster's line: call "
                                 "wait_placement() again, or cancel() it", job_id=self.id, waited=timeout)
        if self._placement is None:
            raise self._error or JobFailed("GangNotPlaced", "the gang ended before it was placed", job_id=self.id)
        return self._placement

    def waiting_for(self) -> str | None:
        """Why the gang is not placed yet, as ``gpulayer status`` shows it: the coordinator's reason and the
        gang's place in the cluster's line; None when it is not waiting (placed, ended, or just sent)."""
        try:
            rec = self.store.record(self.id)
            if rec["state"] != GangState.WAITING.value or rec["reason"] == FIRST_REASON:
                return None
            place = self.store.place_in_line(self.id)
        except BROKER_ERRORS as err:
            raise self._lost.error(err) from err
        return rec["reason"] + (f" (#{place} in line)" if place else "")

    def status(self) -> dict:
        """The gang's record: state, reason (why it waits, or where it runs), attempt (from 0), placement;
        ``preemptions`` (how many attempts a gang of higher priority stopped; none used a restart),
        ``preempted`` (the last one's ``preempted by <id> (<reason>)``), ``preempted_attempts`` (a line each);
        ``max_restarts``, and ``restarts``: one line per failed attempt that was restarted, e.g.
        ``attempt 1 failed (rank 2 on w-b: killed by SIGKILL); restarting 2 x 2 (attempt 2 of 2), every node
        from node 0's files (1 file, 18 bytes, from w-a)``."""
        try:
            rec = self.store.record(self.id)
            rec["max_restarts"] = self.spec.max_restarts
            done = self.store.attempts(self.id)
            rec["restarts"] = [self._announce(entry) for entry in done
                               if entry["outcome"] == "failed" and entry["attempt"] < rec["attempt"]]
            # One line per attempt stopped for a gang of higher priority: "attempt 1 preempted by <id> (...)".
            rec["preempted_attempts"] = [self._announce(entry) for entry in done if entry["outcome"] == "preempted"]
        except BROKER_ERRORS as err:
            raise self._lost.error(err) from err
        return rec

    def on_restart(self, fn: Callable[[dict, str], None]) -> None:
        """Call ``fn(attempt entry, line)`` for each attempt that failed and was restarted (``max_restarts``),
        those already past included; the line is ``status()``'s (``gpulayer train`` prints it)."""
        with self._restart_lock:
            self._restart_listeners.append(fn)
            past = list(self._restarts)
        for entry, line in past:
            fn(entry, line)

    @property
    def attempts(self) -> list[dict]:
        """Every attempt so far, in order: ``attempt``, ``workers``, ``placement``, ``outcome`` (``running``,
        ``succeeded``, ``failed``), ``failure``, ``failed_rank``, ``lost_workers``; a failed one also ``cause``
        (``rank 2 on w-b: exit 9``) and, when restarted, ``restart_from`` (where the next started). The cluster records each
        attempt as it ends (``coordinator.conclude``); a running one comes from the gang's record."""
        done = self.store.attempts(self.id)
        rec = self.store.record(self.id)
        if rec.get("state") == GangState.RUNNING.value and rec.get("placement") and \
                all(a["attempt"] != rec["attempt"] for a in done):
            done.append(attempts.record(rec["attempt"], GangPlacement.model_validate(rec["placement"])))
        return done

    def get(self, timeout: float | None = None) -> list[Any]:
        """Per-rank return values (index = rank), or ``JobFailed`` naming the failed rank.

        ``ClusterUnavailable`` when the broker is unreachable at the ``timeout`` (the watcher rides out a
        broker restart), or has been for a minute.
        """
        deadline = Deadline(timeout)
        # In slices: the waiting thread runs now and then, so an interrupt another thread raises in it
        # (`gpulayer train` when its reader goes away) lands within a moment.
        while not self._done.wait(deadline.left(0.25)) and not deadline.expired():
            pass
        if not self._done.is_set():
            if self._lost.ongoing:
                raise self._lost.error()
            why = self.waiting_for()
            doing = f"waiting: {why}" if why else self.status()["state"]
            raise JobTimeout(f"distributed job {self.id} did not finish within {timeout:g} s: {doing}; it runs on: "
                             "call get() again to wait longer, or cancel() to stop it", job_id=self.id, waited=timeout)
        if self.spec.output is not None:
            # Every line first: each node sent its ranks' last lines before it reported its end, so a marker
            # sent now on this process's channel comes after them all.
            watch.sync()
            if self._output:  # and a line read after its rank ended, if any, still goes to on_output
                watch.unroute(self.id, quiet=OUTPUT_QUIET)
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self) -> None:
        """Stop every rank everywhere and free the slots."""
        self.store.cancel(self.id)
        self._done.wait(30)

    # -- the watcher -----------------------------------------------------------------------------
    def logs(self, rank: int | None = None) -> str:
        """What rank ``rank`` printed (stdout, stderr, ``logging``), as kept: its newest lines, up to 1 MiB, of
        every attempt; without ``rank``, every rank's, rank by rank, each line prefixed ``(rank R)``."""
        try:
            if rank is not None:
                if not 0 <= rank < self.spec.world_size:
                    raise ValueError(f"rank {rank} is not one of distributed job {self.id}'s ranks (0 to "
                                     f"{self.spec.world_size - 1})")
                return tail.text(self.store.r, self.id, rank)
            return tail.ranks_text(self.store.r, self.id, self.spec.world_size)
        except BROKER_ERRORS as err:
            raise broker_lost(err, f"the output of distributed job {self.id} was not read") from err

    def _drive(self) -> None:
        try:
            while True:
                events = self.store.r.pubsub(ignore_subscribe_messages=True)
                try:
                    events.subscribe(keys.gang_events(self.id))
                    self._listening.set()
                    while not self._settle(self.store.record(self.id), events):
                        events.get_message(timeout=LOOK_EVERY)
                        self._lost.back()
                    return
                except BROKER_ERRORS as err:  # the handle outlives a Redis restart; a lost Redis, it says so
                    self._lost.lost(err)
                finally:
                    events.close()
        except BaseException as err:  # never leave a waiter hanging
            self._error = err
        finally:
            self._listening.set()
            self._done.set()
            self._placed.set()

    def _announce(self, entry: dict) -> str:
        return attempts.announcement(entry, self.spec.nodes, self.spec.procs_per_node, self.spec.max_restarts)

    def _saw_attempt(self, attempt: int) -> None:
        """The record is at ``attempt``: tell the listeners about the restarts before it not yet told."""
        if attempt <= self._restart_seen:
            return
        entries = [e for e in self.store.attempts(self.id) if self._restart_seen <= e["attempt"] < attempt]
        with self._restart_lock:
            self._restart_seen = attempt
            new = [(e, self._announce(e)) for e in entries]
            self._restarts += new
            listeners = list(self._restart_listeners)
        for entry, line in new:
            for fn in listeners:
                try:
                    fn(entry, line)
                except Exception:  # a listener never stops the watcher
                    pass

    def _settle(self, rec: dict, events) -> bool:
        """Take in the record's state; True once the gang has ended (result or error set)."""
        state, attempt = rec["state"], rec["attempt"]
        if state is not None:
            self._saw_attempt(attempt)
        if state is None:
            if switched_within(self.store.r, RECONCILE_WAIT) is not None:
                return False  # the broker just failed over: a worker that runs the gang puts its record back
            self._error = JobFailed("GangLost", f"distributed job {self.id} has no record in Redis (expired, or Redis "
                                    "lost its data); submit it again", job_id=self.id)
            return True
        if rec.get("placement"):
            placement = GangPlacement.model_validate(rec["placement"])
        else:
            placement = None
        if state == GangState.RUNNING.value:
            if not self._placed.is_set() or self.attempt != attempt:
                self.attempt, self._placement = attempt, placement
                self._placed.set()
            return False
        if state == GangState.WAITING.value:
            if self.attempt != attempt:  # restarting: the whole gang is placed again
                self.attempt = attempt
                self._placed.clear()
            self._check_stranded(rec)
            return False
        self.attempt = attempt
        self._placement = placement or self._placement
        if state == GangState.SUCCEEDED.value:
            results = self.store.results(self.id, attempt)
            self._result = [signing.loads(results[r]) for r in range(self.spec.world_size)]
        elif state == GangState.CANCELLED.value:
            if self._placement is not None:
                self._wait_nodes_stopped(events)  # cancel() returns once every slot is free again
            self._error = JobFailed("Cancelled", f"distributed job {self.id} was cancelled", job_id=self.id)
        elif placement is None:  # this attempt was never placed: refused (no live worker for a restart), or timed out
            self._error = JobRejected(rec["reason"])
        else:
            error = attempts.failure(self.id, self.store.failures(self.id, attempt), self.store.nodes(self.id, attempt),
                                     self.spec.procs_per_node)
            if error is not None:  # a GangFailed that is also the failed rank's own exception type, where it can be
                error = remote_errors.gang_failure(error, error.exc_report)
            self._error = error or JobFailed("GangFailed", rec["reason"], job_id=self.id)
        return True

    def _check_stranded(self, rec: dict) -> None:
        """A gang far past its timeout that no coordinator ended (no live worker left): end it here."""
        since = rec.get("waiting_since")
        if self.spec.timeout is None or since is None:
            return
        secs, micros = self.store.r.time()
        if secs + micros / 1e6 - since > self.spec.timeout + NO_COORDINATOR_GRACE:
            self.store.finish_if_waiting(self.id, GangState.FAILED,
                                         f"distributed job {self.id} did not fit within {self.spec.timeout}s and "
                                         f"no coordinator ended it (no live worker?): {rec['reason']}")

    def _wait_nodes_stopped(self, events, timeout: float = 30.0) -> None:
        """Until every node of the attempt reported (announced as ``stopped:<attempt>``), or ``timeout``."""
        deadline = Deadline(timeout)
        while len(self.store.nodes(self.id, self.attempt)) < self.spec.nodes and not deadline.expired():
            events.get_message(timeout=deadline.left(LOOK_EVERY))
