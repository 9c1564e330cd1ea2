"""The worker-side request for gpulayer's tasks: who holds which message, and bounded redelivery.

Runs in the worker's main process. Each message the worker takes is recorded
under its id (delivery tag -> job id) until it is acknowledged, so the janitor
can hand a dead worker's messages back at once. A job whose process dies is
delivered again, up to ``max_deliveries`` times in all, then fails saying so.
"""

from __future__ import annotations

import logging

import redis
from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from ..app import settings as app_settings
from ..store.jobs import JobRecords
from ..errors import JobStopped
from . import reaper, runtime

log = logging.getLogger(__name__)
_records: JobRecords | None = None
_released: list[str] = []  # delivery tags acknowledged since the last flush


def flush_released(app) -> None:
    """Forget the records of acknowledged messages, in one command (called every heartbeat)."""
    if not _released:
        return
    tags = _released[:]
    del _released[: len(tags)]
    try:
        records(app).release(_worker_id(app), *tags)
    except redis.RedisError:
        _released.extend(tags)  # next time


def records(app) -> JobRecords:
    global _records
    if _records is None:
        _records = JobRecords(redis.Redis.from_url(app.conf.broker_url, socket_timeout=10))
    return _records


def _worker_id(app) -> str | None:
    info = runtime.current_worker()
    return info.id if info else None


class JobRequest(Request):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tag = getattr(self._message, "delivery_tag", None)
        self._held = False
        wid = _worker_id(self.app)
        if wid and self._tag:
            try:
                records(self.app).hold(wid, self._tag, self.id)
                self._held = True
            except redis.RedisError as err:  # the broker is restarting; the visibility timeout still covers it
                log.warning("gpulayer: could not record message %s of job %s: %s", self._tag, self.id, err)

    def _let_go(self) -> None:
        # Cleared in bulk by the heartbeat (flush_released): a record that outlives its message is
        # harmless, the janitor checks that a message is still unacknowledged before requeueing it.
        if self._held:
            _released.append(self._tag)
            self._held = False

    def acknowledge(self):
        super().acknowledge()
        self._let_go()

    def reject(self, requeue=False):
        super().reject(requeue=requeue)
        self._let_go()

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        why = reaper.stopped.pop(self.id, None)
        if why is not None:  # cancelled or over its timeout: the reaper killed it on purpose
            exc_info.exception = JobStopped(f"job {why}")
            return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        if isinstance(exc, WorkerLostError) and self.task.acks_late and not self._already_revoked:
            settings = app_settings()
            limit = settings.max_deliveries if settings else 3
            try:
                lost = records(self.app).record_loss(self.id, _worker_id(self.app) or "?")
            except redis.RedisError:
                lost = limit  # cannot count: do not risk an endless loop
            if lost < limit:
                log.warning("gpulayer: job %s lost its process (%s); delivering it again (%d of %d)",
                            self.id, exc, lost + 1, limit)
                from celery.worker.state import task_ready

                task_ready(self)
                self.reject(requeue=True)
                return
            exc_info.exception = WorkerLostError(
                f"{exc}; the job's process died on all {lost} deliveries (limit {limit}), so it was not "
                "delivered again: the job itself most likely crashes its process (segfault, os._exit, "
                "out of memory)")
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
