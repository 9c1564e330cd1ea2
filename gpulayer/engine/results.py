"""Celery's Redis result backend, with failures turned into ``JobFailed`` and results stored once.

Every path that reads a result (``AsyncResult.get``, group joins, batch
gathering) goes through ``meta_from_decoded``, so the user always sees one
error type carrying the remote type name, message, traceback and the worker
the job ran on (stored with the failure, see ``_get_result_meta``). A result is
written with one script call (``store_once.lua``), without Celery's read of the
key before it. Overrides Celery 5.7's ``RedisBackend`` (pinned in engine/upstream.py); ``app.configure``
names it as ``gpulayer.engine.results:ResultBackend``.
"""

from __future__ import annotations

import sys

import redis
from celery import states
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str

from ..store import keys
from ..store.connection import TLSConnection
from ..store.registry import load_script
from ..store.results import as_job_failed


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

    def _store_result(self, task_id, result, state, traceback=None, request=None, **kwargs):
        """Celery's, without its read of the stored result first (one round trip per job): store_once.lua
        already refuses to write over a final state."""
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        try:
            self._set_with_state(self.get_key_for_task(task_id), self.encode(meta), state)
        except BackendStoreError as ex:
            raise BackendStoreError(str(ex), state=state, task_id=task_id) from ex
        return result

    def _store_once(self, key, job_id, value, expires, final):
        if getattr(self, "_store_script", None) is None:
            self._store_script = load_script(self.client, "store_once")
        return self._store_script(keys=[key, keys.job_done(job_id)], args=[value, expires, final])

    def _get_result_meta(self, result, state, traceback, request, format_date=True, encode=False):
        meta = super()._get_result_meta(result, state, traceback, request, format_date=format_date, encode=encode)
        if state in states.EXCEPTION_STATES and "worker" not in meta:
            host = getattr(request, "hostname", None)  # the Celery node name, "<worker id>@<host>"
            if host:
                meta["worker"] = str(host).split("@", 1)[0]
        return meta

    def on_task_call(self, producer, task_id):
        # Celery subscribes to every job's result channel as it is sent: a SUBSCRIBE per submit (and an
        # UNSUBSCRIBE when its handle goes), half of a submit's Redis work. get() and group joins subscribe
        # first and then read the stored result (on_wait_for_pending), so none is missed without it.
        pass

    def remove_pending_result(self, result):
        # AsyncResult.__del__ calls this; at interpreter exit there is nothing left to unsubscribe
        # from, and reconnecting then prints "Exception ignored in ... sys.meta_path is None".
        if sys.is_finalizing():
            return result
        try:
            return super().remove_pending_result(result)
        except Exception:  # Redis is gone (a test's or script's cluster stopped): the subscription went with it
            return result

    def meta_from_decoded(self, meta):
        meta = super().meta_from_decoded(meta)
        if meta.get("status") in states.EXCEPTION_STATES and isinstance(meta.get("result"), BaseException):
            meta["result"] = as_job_failed(meta["result"], meta.get("traceback"), meta.get("task_id"),
                                           meta.get("worker"))
        return meta
