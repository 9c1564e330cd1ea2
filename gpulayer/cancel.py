"""Stopping many jobs at once, and what Ctrl-C says about the jobs it leaves behind.

A cancel has two halves, each one message per ``_CHUNK`` ids however many jobs
it names: a revoke broadcast (Celery's; every worker drops the queued ones on
sight) and a publish of the ids on the cancel channel (each worker's reaper
kills the process tree of the ones it runs, worker/reaper.py). Both reach every
worker: the client does not know which worker took a job (the delivery record
is kept per worker, ``store/keys.py`` ``inflight``), so a cancel costs one
message per worker per chunk, never one per worker per job. Jobs whose
results are stored are left out, found with one MGET per ``_CHUNK`` ids.

Ctrl-C while waiting on jobs does not stop them: they run on the workers
whether or not anyone waits. ``interrupted`` builds the ``KeyboardInterrupt``
that says so in one line and names the call that stops them, and the shell
command (`gpulayer cancel <id>`, cli/cancel.py, which uses ``cancel_jobs`` too).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import GroupResult

from . import app as app_mod
from .deadline import Deadline
from .engine.results import prime_result
from .errors import JobFailed
from .session import BROKER_ERRORS, broker_lost, outage
from .store import keys
from .sweep import Sweep
from .tasks.refs import cancelled as release_cancelled, value_of
from .users import permits
from .tasks.whereabouts import batch_timeout, holders, unfinished  # noqa: F401 (unfinished: also cancel's API)

log = logging.getLogger(__name__)
_CHUNK = 1000  # ids per MGET and per revoke broadcast


def held_by_workers(ids: Sequence[str]) -> dict[str, str]:
    """The ids among ``ids`` that a worker holds now (running, or taken ahead of a free slot), each with that
    worker's id: every worker life's delivery record (``keys.inflight``), found with one SCAN. For reports;
    a cancel needs no split."""
    return {job: worker for job, (worker, _) in holders(ids).items()}


def cancel_jobs(ids: Sequence[str], only_unfinished: bool = True) -> int:
    """Drop the queued jobs of ``ids`` and kill the process trees of the running ones; returns how many.

    ``only_unfinished``: first leave out the jobs whose results are stored (one MGET per chunk).
    """
    try:
        targets = unfinished(ids) if only_unfinished else list(ids)
        if not targets:
            return 0
        client = app_mod.app.backend.client  # pooled: no new connection per cancel
        pipe = client.pipeline(transaction=False)
        for start in range(0, len(targets), _CHUNK):
            chunk = targets[start:start + _CHUNK]
            app_mod.app.control.revoke(chunk)  # queued: every worker drops them on sight
            pipe.publish(keys.CANCEL_CHANNEL, permits.pack(chunk))  # running: their workers' reapers kill them
        pipe.execute()
        for start in range(0, len(targets), _CHUNK):  # the objects their arguments held go with them
            release_cancelled(client, targets[start:start + _CHUNK])
    except BROKER_ERRORS as err:
        raise broker_lost(err, f"nothing was cancelled ({len(ids)} job(s) asked for): cancel again once it is back"
                          ) from err
    return len(targets)


def interrupted(ids: Sequence[str], how: str, cancel_id: str | None = None) -> KeyboardInterrupt:
    """The one-line ``KeyboardInterrupt`` for Ctrl-C while waiting on ``ids``; ``how`` stops them from Python,
    ``gpulayer cancel <cancel_id>`` (the job's, batch's or group's id; default: the one job's) from a shell."""
    cancel_id = cancel_id or (ids[0] if len(ids) == 1 else None)
    if cancel_id:
        how = f"{how} or `gpulayer cancel {cancel_id}`"
    try:
        left = len(unfinished(ids))
    except Exception:  # Redis gone or the wait cut mid-reply: say what we cannot know
        left = None
    total = len(ids)
    if left == 0:
        return KeyboardInterrupt(f"stopped waiting; all {total} job(s) had finished" if total > 1 else
                                 "stopped waiting; the job had finished")
    if total == 1:
        state = "is still queued or running" if left else "may still be queued or running"
        return KeyboardInterrupt(f"stopped waiting; job {ids[0]} {state} on the cluster: stop it with {how}")
    count = f"{left} of {total} jobs are" if left is not None else f"up to {total} jobs may be"
    return KeyboardInterrupt(f"stopped waiting; {count} still queued or running on the cluster: "
                             f"stop them with {how}")


class JobGroupResult(Sweep, GroupResult):
    """A group's result: Ctrl-C in ``get()`` says what still runs, a timeout (``JobTimeout``) what the jobs not
    finished are doing; ``revoke()`` stops queued and running jobs. A failure names its job's place in the
    group (``item 3 of 20``). ``completed_count()``, ``failed()``, ``ready()`` (Celery's, read in one round
    trip for the whole group), ``as_completed()`` and ``wait(n, timeout)``: ``gpulayer/sweep.py``."""

    def _sweep_ids(self) -> list[str]:
        return [r.id for r in self.results]

    def _sweep_backend(self):
        return app_mod.app.backend

    def _sweep_handle(self, index: int, meta: dict | None):
        handle = self.results[index]
        if meta is not None:
            _place(meta["result"], index, len(self.results))
            if getattr(handle, "_cache", None) is None:
                prime_result(handle, meta)
        return handle

    def _sweep_timeout(self, pending: list[str], timeout: float | None) -> Exception:
        return batch_timeout(self._sweep_ids(), pending, timeout, stop="revoke()")

    def _sweep_interrupted(self) -> KeyboardInterrupt:
        return interrupted(self._sweep_ids(), "result.revoke()", self.id)

    def get(self, timeout=None, propagate=True, interval=0.5, callback=None, no_ack=True, on_message=None,
            disable_sync_subtasks=True, on_interval=None):
        # Celery's ResultSet.get, calling the joins below directly: a Ctrl-C shows no engine frame.
        join = self.join_native if self.supports_native_join else self.join
        deadline = Deadline(timeout)
        # A broker restart is ridden out (the join starts again once Redis is back); a lost one is said plainly.
        lost = outage(deadline, f"a group of {len(self.results)} jobs was sent; its results wait in Redis if the "
                                "broker comes back with its data: call get() again then")
        while True:
            try:
                left = deadline.remaining()
                values = join(timeout=None if left is None else max(left, 0.001),  # (Celery reads 0 as no limit)
                              propagate=propagate, interval=interval, callback=callback, no_ack=no_ack,
                              on_message=on_message, disable_sync_subtasks=disable_sync_subtasks,
                              on_interval=on_interval)
                for i, value in enumerate(values or ()):  # propagate=False: each failure in its place, named
                    _place(value, i, len(self.results))
                return [value_of(value) for value in values] if values else values  # large results: values
            except JobFailed as err:  # the failure raised: name its job's place in the group
                ids = self._sweep_ids()
                if err.job_id in ids:
                    _place(err, ids.index(err.job_id), len(ids))
                raise err.with_traceback(None)  # raised here: no frame of Celery's or vine's shown
            except BROKER_ERRORS as err:
                lost.lost(err)
            except CeleryTimeoutError:
                if not deadline.expired():
                    raise
                ids = [r.id for r in self.results]
                raise batch_timeout(ids, unfinished(ids), timeout, stop="revoke()") from None

    def join(self, *args, **kwargs):
        try:
            return super().join(*args, **kwargs)
        except KeyboardInterrupt:
            raise interrupted([r.id for r in self.results], "result.revoke()", self.id) from None

    def join_native(self, *args, **kwargs):
        try:
            return super().join_native(*args, **kwargs)
        except KeyboardInterrupt:
            raise interrupted([r.id for r in self.results], "result.revoke()", self.id) from None

    def revoke(self, connection=None, terminate=False, signal=None, wait=False, timeout=None) -> int:
        """Stop every job of the group that has not finished: queued ones are dropped, running ones
        killed with their whole process tree (whatever ``terminate`` says). Returns how many."""
        return cancel_jobs([r.id for r in self.results])


def _place(value, index: int, total: int) -> None:
    if isinstance(value, JobFailed) and value.index is None:
        value.in_batch(index, total)


# Every group this app makes (group(...).apply_async(), GroupResult.restore) is one of these.
app_mod.app.GroupResult = app_mod.app.subclass_with_self(JobGroupResult, reverse="GroupResult")
