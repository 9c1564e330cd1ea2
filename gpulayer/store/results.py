"""Celery's Redis result backend, with failures turned into ``JobFailed``.

Every path that reads a result (``AsyncResult.get``, group joins, batch
gathering) goes through ``meta_from_decoded``, so the user always sees one
error type carrying the remote type name, message and traceback.
"""

from __future__ import annotations

from celery import states
from celery.backends.redis import RedisBackend

from ..errors import JobFailed

_DIED = ("WorkerLostError",)


def as_job_failed(exc: BaseException, traceback: str | None, job_id: str | None) -> JobFailed:
    if isinstance(exc, JobFailed):
        return exc
    type_name = type(exc).__name__
    message = str(exc) or repr(exc)
    if type_name in _DIED:
        message = (f"the job's process died: {message.strip()} (it crashed, called os._exit, or was killed, "
                   "e.g. for memory); the worker and its other jobs carry on")
    return JobFailed(type_name, message, traceback, job_id)


class ResultBackend(RedisBackend):
    def meta_from_decoded(self, meta):
        meta = super().meta_from_decoded(meta)
        if meta.get("status") in states.EXCEPTION_STATES and isinstance(meta.get("result"), BaseException):
            meta["result"] = as_job_failed(meta["result"], meta.get("traceback"), meta.get("task_id"))
        return meta
