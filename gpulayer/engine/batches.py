"""Several tiny jobs to a pool process in one exchange.

A tiny job's time in a worker is mostly the exchange with its pool process: Celery's ``ApplyResult``, the
job pickled into the process's pipe, the process's ACK and READY messages read back and dispatched, each job
alone. While a worker has a backlog of ordinary jobs taken ahead of its slots (engine/prefetch.py), the
transport hands Celery up to ``size`` of them for one free slot at once (:meth:`Batches.group_size`), and the
pool applies they make while it does (:func:`collecting`) go to one pool process as one job: :func:`run_batch`
runs each in turn with Celery's trace, as the process would have run it alone, and returns every job's
outcome together. Each job keeps its own Celery request, in the main process: its ``task-started`` event,
``inspect active``, its result and its ack are its own.

What stays as it was, and how:

- **A slot is a pool process.** A batch holds one slot; the slot gate counts it once (:func:`extra_reserved`,
  :func:`extra_active`, read by engine/qos.py), so gangs, ``gpulayer status`` and the heartbeat see slots.
- **A job that kills its process** takes its batch with it. None of them is counted a lost delivery (of
  ``max_deliveries``): each goes back to its queue, and a message delivered again never joins a batch, so the
  one that kills its process dies alone next time and only its own deaths count. Its batch-mates run again
  (delivery is at least once, a result is stored once).
- **A cancel or a timeout** kills a job's process: a job with a ``timeout`` never joins a batch, and a
  cancelled job's batch-mates go back to their queue as above.
- **A slow job among tiny ones** (the rule the take follows, engine/prefetch.py): a batch starts at one job a
  slot, doubles (up to ``BATCH_MAX``) while every job of a full batch started within ``QUICK`` of the batch's
  start, and goes back to one as soon as one started more than ``SLOW`` after it. So a slow job holds back at
  most the rest of one batch, and only under a backlog: without one (fewer messages waiting than free slots)
  every job goes alone. Its batch-mates' ``task-started`` time is the batch's (within ``QUICK``).

The worker's pool applies reach :meth:`Batches.on_apply` in place of billiard's ``Pool.apply_async`` (Celery's
``TaskPool.on_apply``); Celery's semaphore of one request per pool process (``WorkController._process_task_sem``)
is left out, since the slot gate already admits the requests a slot at a time. Both are pinned in
engine/upstream.py.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery import bootsteps

from .upstream import patch

log = logging.getLogger(__name__)

BATCH_MAX = 8  # jobs a pool process gets in one exchange, at most
QUICK = 0.01  # seconds: a full batch whose every job started within this of its start doubles the next
SLOW = 0.1  # seconds: a batch one of whose jobs started later than this after its start sends the next alone
TASK = "gpulayer.submit"  # gpulayer.app.SUBMIT (engine/ cannot import the app module, which imports it)
TIMEOUT_HEADER = "gl_timeout"  # a job's timeout (worker/reaper.py enforces it); gpulayer.app exports it


_position: tuple[int, int] | None = None  # in a pool process: (index, size) of the batched job running now


def run_batch(calls: list) -> list:
    """In a pool process: run each ``(function, args, kwargs)`` in turn, as billiard's worker loop runs one job,
    and return each one's ``(True, value)`` or ``(False, ExceptionInfo)``."""
    global _position
    out = []
    try:
        for i, (fun, args, kwargs) in enumerate(calls):
            _position = (i, len(calls))
            try:
                out.append((True, fun(*args, **kwargs)))
            except Exception:
                out.append((False, ExceptionInfo()))
    finally:
        _position = None
    return out


def position() -> tuple[int, int] | None:
    """Inside a job: ``(its index, the batch's size)`` when it runs in a batch of tiny jobs, else None."""
    return _position


def batchable(message: dict) -> bool:
    """May this taken message (kombu's dict) share a pool exchange? An ordinary job, delivered for the first
    time, without a timeout, an ETA or Celery time limits."""
    headers = message.get("headers") or {}
    if headers.get("task") != TASK or headers.get("redelivered") or headers.get(TIMEOUT_HEADER) or headers.get("eta"):
        return False
    limits = headers.get("timelimit")
    return not limits or not any(limits)


class _Batch:
    __slots__ = ("applies", "accepted", "full")

    def __init__(self, applies: list, full: bool):
        self.applies = applies  # (target, args, kwargs, options) of each pool apply, in order
        self.accepted = False  # its process sent the ACK
        self.full = full  # as big as batches went then: more were waiting (Batches.full_in_flight)


class Batches:
    """The worker's batches: forming one, the ones in flight, and the size of the next."""

    def __init__(self):
        self.size = 1  # jobs for one slot in the next group (group_size)
        self.apply = None  # billiard's Pool.apply_async, once installed
        self.targets: tuple = ()  # the trace functions a job's request applies (set by engine/request.py: install)
        self._forming: list | None = None  # applies collected while a group is delivered
        self.extra_reserved = 0  # requests beyond one per batch, from the batch's send to its outcome
        self.extra_active = 0  # the same, from its ACK to its outcome
        self.full_in_flight = 0  # batches in their pool processes that were full when sent (engine/prefetch.py
        # takes the next batch's messages while one is: a backlog of tiny jobs)

    # -- forming -----------------------------------------------------------------------------------
    def group_size(self, waiting: int, free: int) -> int:
        """Jobs to hand Celery for one free slot now: 0 (alone, not collected) unless more are waiting than the
        free slots take alone, then shared fairly between the free slots, up to ``size``."""
        if self.apply is None or waiting <= free:
            return 0
        return min(self.size, -(-waiting // max(1, free)))

    @contextmanager
    def collecting(self):
        """Pool applies made inside (one group's deliveries, under a backlog) go to one pool process together."""
        if self.apply is None or self._forming is not None:
            yield
            return
        self._forming = []
        try:
            yield
        finally:
            forming, self._forming = self._forming, None
            self._send(forming)

    def on_apply(self, target, args=None, kwargs=None, **options):
        """Celery's ``TaskPool.on_apply``: a request's apply joins the batch being formed, or goes alone."""
        if (self._forming is not None and target in self.targets and not options.get("timeout")
                and not options.get("soft_timeout")):
            self._forming.append((target, args or (), kwargs or {}, options))
            return None  # (Celery keeps a weak reference to what apply returns, when it is not None)
        return self.apply(target, args, kwargs, **options)

    def _send(self, applies: list) -> None:
        if not applies:
            return
        if len(applies) == 1:  # (under a backlog: a quick one lets the next group have two)
            target, args, kwargs, options = applies[0]
            if self.size == 1 and options.get("callback") is not None:
                options = {**options, "callback": self._probe(options["callback"])}
            self.apply(target, args, kwargs, **options)
            return
        batch = _Batch(applies, len(applies) >= self.size)
        self.extra_reserved += len(applies) - 1
        self.full_in_flight += batch.full
        first = applies[0][3]
        self.apply(run_batch, ([(t, a, k) for t, a, k, _ in applies],), {},
                   callback=lambda outcomes: self._done(batch, outcomes),
                   error_callback=lambda einfo: self._lost(batch, einfo),
                   accept_callback=lambda pid, when: self._accepted(batch, pid, when),
                   waitforslot=first.get("waitforslot"), callbacks_propagate=first.get("callbacks_propagate", ()),
                   correlation_id=first.get("correlation_id"))

    # -- outcomes ----------------------------------------------------------------------------------
    def _accepted(self, batch: _Batch, pid, when) -> None:
        batch.accepted = True
        self.extra_active += len(batch.applies) - 1
        for _, _, _, options in batch.applies:
            accept = options.get("accept_callback")
            if accept is not None:
                accept(pid, when)

    def _finish(self, batch: _Batch, calls: list) -> None:
        """Hand each request of a batch whose process is done its outcome (``calls``: ``(callback, argument)``).

        The process is free from now: the batch stops holding a slot at once, and each request stops counting
        as it finishes (``extra_*`` follow its requests out of Celery's worker state), so the first job's ack
        already hands the next jobs to the process while the others' outcomes are handled (engine/qos.py). A
        request that fails to finish keeps counting: the gate may under-count free slots, never over-count
        them."""
        accepted, batch.accepted = batch.accepted, False
        self.full_in_flight -= batch.full
        batch.full = False
        self.extra_reserved += 1  # n - 1 -> n: the batch's n requests count as no slot
        if accepted:
            self.extra_active += 1
        done = 0
        try:
            for call, argument in calls:
                # The request counts again until its callback finishes it (Celery's task_ready, before its ack
                # lets the next batch start): the slot never looks freer than it is.
                done += 1
                self.extra_reserved -= 1
                if accepted:
                    self.extra_active -= 1
                try:
                    if call is not None:
                        call(argument)
                except Exception:  # one job's outcome must not cost its batch-mates theirs
                    log.exception("gpulayer: a batched job's outcome could not be handled")
        finally:
            left = len(batch.applies) - done  # (only if a callback raised past Exception: counted busy again)
            self.extra_reserved -= left
            if accepted:
                self.extra_active -= left

    def _done(self, batch: _Batch, outcomes: list) -> None:
        self._resize(batch, outcomes)
        self._finish(batch, [(options.get("callback" if ok else "error_callback"), value)
                             for (_, _, _, options), (ok, value) in zip(batch.applies, outcomes)])

    def _lost(self, batch: _Batch, einfo) -> None:
        """The batch's process died (or the batch could not run): each job goes back to its queue uncounted,
        except one stopped on purpose (cancelled, timed out, revoked), which fails as it would alone."""
        self.size = 1
        exc = getattr(einfo, "exception", None)
        lost = isinstance(getattr(exc, "exc", exc), WorkerLostError)  # (billiard wraps it: ExceptionWithTraceback)
        calls = []
        for _, _, _, options in batch.applies:
            on_failure = options.get("error_callback")
            request = getattr(on_failure, "__self__", None)
            if lost and request is not None and hasattr(request, "lost_with_batch"):
                calls.append((request.lost_with_batch, einfo))
            else:
                calls.append((on_failure, einfo))
        self._finish(batch, calls)

    def _resize(self, batch: _Batch, outcomes: list) -> None:
        """The size of the next group from when this batch's last job started (the runtimes before it)."""
        waited = 0.0
        for ok, value in outcomes[:-1]:
            runtime = _runtime(value) if ok else None
            waited += SLOW if runtime is None else runtime
        if waited > SLOW:
            self.size = 1
        elif waited <= QUICK and len(batch.applies) >= self.size:
            self.size = min(self.size * 2, BATCH_MAX)

    def _probe(self, callback):
        """``callback`` for a job that went alone while jobs waited: a quick one lets the next group have two."""
        def on_success(value):
            runtime = _runtime(value)
            if self.size == 1 and runtime is not None and runtime <= QUICK:
                self.size = 2
            return callback(value)
        return on_success


def _runtime(value) -> float | None:
    """The runtime in a trace's ``(failed, summary, runtime)``, if ``value`` is one."""
    runtime = value[2] if isinstance(value, tuple) and len(value) == 3 else None
    return runtime if isinstance(runtime, (int, float)) else None


batches = Batches()


def extra_reserved() -> int:
    """Requests the worker holds beyond one per batch (engine/qos.py counts slots, not requests)."""
    return batches.extra_reserved


def extra_active() -> int:
    return batches.extra_active


class PoolBatches(bootsteps.StartStopStep):
    """Consumer step: the worker's pool applies go through :data:`batches`, and Celery's per-request semaphore
    is left out (the slot gate admits requests). Not in a worker whose pool processes run one job each (a CUDA
    worker's ``max_tasks_per_child=1``) or that has Celery time limits."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, c, **kwargs):
        super().__init__(c, **kwargs)
        controller = getattr(c, "controller", None)
        conf = c.app.conf
        self.enabled = bool(controller is not None and getattr(controller, "semaphore", None) is not None
                            and not getattr(controller, "max_tasks_per_child", None)
                            and not conf.task_time_limit and not conf.task_soft_time_limit)
        if self.enabled:
            # Read when the task strategies are built (Tasks.start): requests go to the pool at once.
            patch(c, "celery.worker.worker:WorkController._process_task_sem", controller._process_task,
                  attribute="on_task_request")

    def start(self, c) -> None:
        pool = c.pool
        if not self.enabled or pool is None or getattr(pool, "on_apply", None) is None or batches.apply is not None:
            return
        batches.apply = pool.on_apply
        patch(pool, "celery.concurrency.prefork:TaskPool.on_start", batches.on_apply, attribute="on_apply")
