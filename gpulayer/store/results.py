"""Celery's Redis result backend, with failures turned into ``JobFailed``.

Every path that reads a result (``AsyncResult.get``, group joins, batch
gathering) goes through ``meta_from_decoded``, so the user always sees one
error type carrying the remote type name, message and traceback.
"""

from __future__ import annotations

import redis
from celery import states
from celery.backends.redis import RedisBackend

from ..errors import JobFailed
from . import keys
from .connection import TLSConnection
from .registry import load_script

_DIED = ("WorkerLostError",)


def as_job_failed(exc: BaseException, traceback: str | None, job_id: str | None) -> JobFailed:
    if isinstance(exc, JobFailed):
        return exc
    type_name = type(exc).__name__
    message = str(exc) or repr(exc)
    if type_name == "UnpickleableExceptionWrapper":  # the job raised an exception pickle cannot carry
        type_name = getattr(exc, "exc_cls_name", type_name)
        message = getattr(exc, "text", None) or " ".join(map(str, getattr(exc, "exc_args", ()))) or message
    if type_name == "TaskRevokedError":
        type_name, message = "JobStopped", f"job cancelled before it ran ({message})"
    if type_name in _DIED:
        message = (f"the job's process died: {message.strip()} (it crashed, called os._exit, or was killed, "
                   "e.g. for memory); the worker and its other jobs carry on")
    return JobFailed(type_name, message, traceback, job_id)


class ResultBackend(RedisBackend):
    """Redis results, stored at most once per job, read back with failures as ``JobFailed``."""

    connection_class_ssl = TLSConnection

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # For a rediss:// URL Celery picks redis-py's SSLConnection itself; use the one every gpulayer client uses.
        if self.connparams.get("connection_class") is redis.SSLConnection:
            self.connparams["connection_class"] = TLSConnection

    def _set_with_state(self, key, value, state):
        key = key.decode() if isinstance(key, bytes) else key
        prefix = self.task_keyprefix
        prefix = prefix.decode() if isinstance(prefix, bytes) else prefix
        if not key.startswith(prefix):  # a saved group (GroupResult.save, a chord's nested header): no job
            return super()._set_with_state(key, value, state)
        job_id = key[len(prefix):]
        expires = self.failure_expires if state == states.FAILURE and self.failure_expires else self.expires
        final = "1" if state in states.READY_STATES else "0"
        return self.ensure(self._store_once, (key, job_id, value, int(expires or 7 * 86400), final))

    def _store_once(self, key, job_id, value, expires, final):
        if getattr(self, "_store_script", None) is None:
            self._store_script = load_script(self.client, "store_once")
        return self._store_script(keys=[key, keys.job_done(job_id)], args=[value, expires, final])

    def meta_from_decoded(self, meta):
        meta = super().meta_from_decoded(meta)
        if meta.get("status") in states.EXCEPTION_STATES and isinstance(meta.get("result"), BaseException):
            meta["result"] = as_job_failed(meta["result"], meta.get("traceback"), meta.get("task_id"))
        return meta
