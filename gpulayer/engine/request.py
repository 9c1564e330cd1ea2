"""The worker-side request for gpulayer's tasks: bounded redelivery, and jobs logged by their summary.

Runs in the worker's main process. Which worker holds which message is
recorded by the transport as the message is taken (engine/transport.py), so the
janitor can hand a dead worker's messages back at once. A job whose process
dies is delivered again, up to ``max_deliveries`` times in all, then fails
saying so. A success whose result the job's process left to this one
(engine/results.py, :class:`StoreLater`) goes to the channel that took the job,
which stores it with the job's ack. Overrides Celery 5.7's ``Request.__init__``,
``info`` and ``on_failure``, and patches the trace functions Celery's requests
send to the pool (pinned in engine/upstream.py).
"""

from __future__ import annotations

import logging
import time

import redis
from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.app import trace as celery_trace
from celery.worker import request as celery_request
from celery.worker.request import Request
from celery.worker.state import task_ready

from ..store.jobs import JobRecords
from ..store.results import STOPPED_WHILE_RUNNING, process_died
from ..store.connection import connect_redis
from .sentinel import broker_url
from ..errors import JobStopped
from ..procs import runtime
from . import revoke, transport
from .batches import batches
from .results import StoreLater, trace_storing_later
from .upstream import patch

# How a worker logs each job it takes: its readable summary, never its pickled bytes.
LOG_RECEIVED = "Job %(id)s received: fn=%(args)s resources=%(kwargs)s"

log = logging.getLogger(__name__)
_records: JobRecords | None = None


def records(app) -> JobRecords:
    global _records
    if _records is None:
        _records = JobRecords(connect_redis(broker_url(app), socket_timeout=10))
    return _records


def _worker_id(app) -> str | None:
    info = runtime.current_worker()
    return info.id if info else None


# Handed in by the worker (worker/main.py): ``code_scope(request, run, *args)`` runs a job's trace in its pool
# process with the job's shipped code first on sys.path (its body may hold objects of the user's modules).
code_scope = None
# Handed in by the worker at install time (the engine imports neither the app nor the worker): the reaper's
# record of the jobs it stopped on purpose (job id -> why), and the worker's settings (``max_deliveries``).
stopped: dict[str, str] = {}
settings = None


def fast_trace_task(*args, **kwargs):
    """What the pool runs for a job (Celery's ``fast_trace_task``, patched in by :func:`install`)."""
    if code_scope is not None:
        return code_scope(args[2], trace_storing_later, _FAST_TRACE, *args, **kwargs)
    return trace_storing_later(_FAST_TRACE, *args, **kwargs)


def trace_task_ret(*args, **kwargs):
    """The same for Celery's ``trace_task_ret`` (a pool without the fast tracer)."""
    if code_scope is not None:
        return code_scope(args[2], trace_storing_later, _TRACE_RET, *args, **kwargs)
    return trace_storing_later(_TRACE_RET, *args, **kwargs)


_FAST_TRACE, _TRACE_RET = celery_trace.fast_trace_task, celery_trace.trace_task_ret


class JobRequest(Request):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Celery's strategy subclasses this class and overrides on_success there, and hands the pool
        # ``self.on_success`` as the job's callback: an instance attribute comes first.
        self.on_success = self._store_then_succeed
        revoke.on_taken(self)  # a user's revoke that reached this worker before the job did (engine/revoke.py)
        if self.delivery_info.get("redelivered"):
            # Celery's "retries" (in the task-received event, so in Flower): the deliveries that died.
            try:
                self._request_dict["retries"] = records(self.app).losses(self.id)
            except redis.RedisError:
                pass  # only the display suffers

    def _store_then_succeed(self, failed__retval__runtime, **kwargs):
        """A success whose result its process left to this one: stored with the job's ack, then Celery's
        on_success (which acks it)."""
        failed, retval, runtime = failed__retval__runtime
        if isinstance(retval, StoreLater):
            channel = getattr(self._message, "channel", None)
            store_later = getattr(channel, "store_later", None)
            if store_later is None or not store_later(retval.store):
                self.task.backend.store_now(retval.store)
            failed__retval__runtime = (failed, str(retval), runtime)
        return type(self).on_success(self, failed__retval__runtime, **kwargs)

    def info(self, safe=False):
        """What ``inspect active/reserved/query_task`` report: the job's readable summary, never its pickle.

        Celery sends the raw args unless asked for ``safe``; for a gpulayer job they are the
        packed function (cloudpickle bytes) and the user's data, so always the summaries
        (``argsrepr`` "train(0.1, epochs=3)", ``kwargsrepr`` the resources), as Flower shows them.
        """
        info = super().info(safe=True)
        info["args"] = self._argsrepr
        info["kwargs"] = self._kwargsrepr
        return info

    def _announce_revoked(self, reason, terminated, signum, expired):
        """A running job that ``revoke(terminate=True)`` killed says so, and for how long it ran (Celery's
        ``terminate`` gives every one the reason "terminated", which reads as a job that never ran).

        A job revoked while it waited (prefetched here, or handed to the pool but not yet taken by a process)
        keeps Celery's ``_terminate_on_ack``, and Celery kills it as a process takes it (``on_accepted``: its
        ``time_start`` is then set, a moment before): that one was cancelled before it ran."""
        if terminated and self._terminate_on_ack is not None:
            reason = "revoked"
        elif terminated and self.time_start:
            reason = f"{STOPPED_WHILE_RUNNING} (after {max(0.0, time.time() - self.time_start):.1f} s)"
        return super()._announce_revoked(reason, terminated, signum, expired)

    def lost_with_batch(self, exc_info) -> None:
        """This job's pool process died while it ran a batch of tiny jobs (engine/batches.py): unless this job
        was stopped on purpose, it goes back to its queue without a lost delivery counted (the batch-mate that
        killed the process is found when, delivered again, it runs alone)."""
        if self.id in stopped or self._already_revoked or not self.task.acks_late:
            return self.on_failure(exc_info)
        log.info("gpulayer: job %s lost its process with its batch; delivering it again", self.id)
        task_ready(self)
        self.reject(requeue=True)

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        why = stopped.pop(self.id, None)
        if why is not None:  # cancelled or over its timeout: the reaper killed it on purpose
            exc_info.exception = JobStopped(f"job {why}")
            return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        if isinstance(exc, WorkerLostError) and self.task.acks_late and not self._already_revoked:
            limit = settings.max_deliveries if settings else 3
            try:
                lost = records(self.app).record_loss(self.id, _worker_id(self.app) or "?")
            except redis.RedisError:
                lost = limit  # cannot count: do not risk an endless loop
            if lost < limit:
                log.warning("gpulayer: job %s lost its process (%s); delivering it again (%d of %d)",
                            self.id, exc, lost + 1, limit)
                task_ready(self)
                self.reject(requeue=True)
                return
            exc_info.exception = WorkerLostError(process_died(str(exc), lost, limit))
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)


def install(app=None, *, stopped_by_reaper: dict[str, str] | None = None, worker_settings=None) -> None:
    """In the worker, before it starts: Celery's "Task received" log line shows a job's summary ("fn=square(12)
    resources=cpu"), the pool runs jobs through :func:`fast_trace_task` / :func:`trace_task_ret`, and a job's
    body is decoded by its pool process only (engine/transport.py ``Message``), unless ``app`` stores a job's
    arguments with its result (Celery's ``result_extended``). ``stopped_by_reaper`` (the reaper's record of
    the jobs it killed, and why) and ``worker_settings`` are the worker's, handed in here."""
    global stopped, settings
    if stopped_by_reaper is not None:
        stopped = stopped_by_reaper
    settings = worker_settings
    transport.args_read_in_main = bool(app is not None and app.conf.result_extended)
    patch(celery_trace, "celery.app.trace:LOG_RECEIVED", LOG_RECEIVED)
    patch(celery_request, "celery.worker.request:fast_trace_task", fast_trace_task)
    patch(celery_request, "celery.worker.request:trace_task_ret", trace_task_ret)
    batches.targets = (fast_trace_task, trace_task_ret)  # what a job's request applies may share an exchange
