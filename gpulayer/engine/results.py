"""Celery's Redis result backend, with failures turned into ``JobFailed`` and results stored once.

Every path that reads a result (``AsyncResult.get``, group joins, batch
gathering) goes through ``meta_from_decoded``, so the user always sees one
error type carrying the remote type name, message, traceback and the worker
the job ran on (stored with the failure, see ``_get_result_meta``). A result is
written with one script call (``store_once.lua``), without Celery's read of the
key before it. Overrides Celery 5.7's ``RedisBackend`` (pinned in engine/upstream.py); ``app.configure``
names it as ``gpulayer.engine.results:ResultBackend``.

**A job's result travels with its ack.** In a worker, a job that succeeds
does not wait on Redis for its result: the pool process hands the encoded
result back with its summary (:class:`StoreLater`), and the worker's main
process stores it in the script that acks the job and takes the next ones
(``store/lua/take.lua``), sent on the same turn of its event loop. The job's
process is then free for the next job at once (a round trip to Redis per job
was a third of a tiny job's time), and a result can never be acked without
being stored: both happen in one script, or neither (the message is then
delivered again, and stored once). Not for a result over ``STORE_LATER_MAX``
bytes, a failure, or a job in a chord, a chain or with callbacks (whose next
steps may read its stored result at once): those are stored by the job's own
process as before.

**A lost broker is the waiter's to ride out.** Celery's consumer of result
channels retries a lost connection for about 20 s (longer than a ``get``'s
timeout may be), then raises ``RuntimeError: Retry limit exceeded ... The
Celery application must be restarted``. :class:`ResultConsumer` tries once and
passes the broker's own error up; the waiters (``JobHandle.get``, a group's
``get``) ride out the outage with their own deadline and say what happened
(``ClusterUnavailable``), or resume when Redis is back.
"""

from __future__ import annotations

import socket
import sys
import threading
from contextlib import contextmanager
from functools import cached_property

import redis
from celery import states
from celery.backends.redis import RedisBackend
from celery.backends.redis import ResultConsumer as RedisResultConsumer
from celery.exceptions import BackendStoreError
from kombu.exceptions import EncodeError
from kombu.utils.encoding import bytes_to_str

from ..deadline import Deadline
from .. import retries, signing
from ..payload import unsendable_result
from ..store import durability, keys
from .redis_tls import TLSConnection
from .senders import owner_of
from .sentinel import backend_pool
from ..store.registry import load_script
from ..remote_errors import RECORD_KEY, take_captured
from ..store.results import as_job_failed, from_record


STORE_LATER_MAX = 64 * 1024  # bytes: a bigger result is stored by the job's own process
_CANVAS = ("chord", "callbacks", "errbacks", "chain")


class StoreLater(str):
    """What a job's process hands back for a success (Celery's summary of the result, a ``str``), with the
    result's store for the worker's main process: ``(result key, done key, encoded value, expires)``."""

    def __new__(cls, summary: str, store: tuple):
        self = super().__new__(cls, summary)
        self.store = store
        return self

    def __reduce__(self):
        return StoreLater, (str(self), self.store)


_tracing = threading.local()  # .later: the job now traced in this thread, then its store (trace_storing_later)


def trace_storing_later(trace, task, uuid, request, *args, **kwargs):
    """Run Celery's ``trace`` (``fast_trace_task`` or ``trace_task_ret``) for one job; a success whose store
    was left for the main process returns its summary as a :class:`StoreLater`."""
    later = _tracing.later = [uuid]
    try:
        failed, value, runtime = trace(task, uuid, request, *args, **kwargs)
        stored_later = later[1:]
    finally:
        _tracing.later = None
    if stored_later:
        backend, store = stored_later[0]
        if not failed and isinstance(value, str):
            return failed, StoreLater(value, store), runtime
        backend.store_now(store)  # (not a success after all: stored here, as it would have been)
    return failed, value, runtime


class ResultConsumer(RedisResultConsumer):
    """Celery's consumer of result channels, without its ``RuntimeError`` when the broker is lost."""

    @contextmanager
    def reconnect_on_error(self):
        try:
            yield
        except socket.timeout:  # a drain's timeout: the caller's to handle, not a lost connection
            raise
        except self._connection_errors:
            self._reconnect()  # still away: the broker's own error goes up, for the waiter to ride out

    def drain_events_until(self, p, timeout=None, on_interval=None):
        """Celery's, each wait cut to what is left of ``timeout``: its drainer waits a second at a time and
        looks at the clock only between waits, so ``get(timeout=0.5)`` gave up after 1.0 s."""
        deadline = Deadline(timeout)

        def wait(timeout=None):
            return self.drain_events(timeout=deadline.left(1.0 if timeout is None else timeout))

        return self.drainer.drain_events_until(p, timeout=timeout, on_interval=on_interval, wait=wait)

    def _reconnect(self):
        """One try: reconnect and subscribe again to every channel; a broker still away raises its error.

        On a failure the consumer is left with no connection and no subscriptions, so the next
        ``consume_from`` starts afresh; the waiters that were subscribed read their results from the
        stored keys meanwhile (``JobHandle.get`` reads its result again every ``WAIT_SLICE``).
        """
        try:
            self._reconnect_pubsub()
        except self._connection_errors:
            with self._locked():
                self._pubsub = None
                self.subscribed_to.clear()
            raise


class ResultBackend(RedisBackend):
    """Redis results, stored at most once per job, read back with failures as ``JobFailed``."""

    connection_class_ssl = TLSConnection
    ResultConsumer = ResultConsumer

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # For a rediss:// URL Celery picks redis-py's SSLConnection itself; use the one every gpulayer client uses.
        if self.connparams.get("connection_class") is redis.SSLConnection:
            self.connparams["connection_class"] = TLSConnection

    @cached_property
    def _extended(self) -> bool:
        """Celery's ``result_extended``, looked up once."""
        return bool(self.app.conf.find_value_for_key("extended", "result"))

    def _get_pool(self, **params):
        """Celery's pool, or on a Sentinel group one whose connections ask the sentinels for the primary."""
        return backend_pool(self.app, params) or super()._get_pool(**params)

    def _set_with_state(self, key, value, state):
        key = key.decode() if isinstance(key, bytes) else key
        prefix = self.task_keyprefix
        prefix = prefix.decode() if isinstance(prefix, bytes) else prefix
        if not key.startswith(prefix):  # a saved group (GroupResult.save, a chord's nested header): no job
            return super()._set_with_state(key, value, state)
        job_id = key[len(prefix):]
        final = "1" if state in states.READY_STATES else "0"
        return self.ensure(self._store_once, (key, job_id, value, self._expires(state), final))

    def _expires(self, state) -> int:
        """Seconds a stored result of ``state`` is kept (Celery's ``result_expires``, or a day)."""
        expires = self.failure_expires if state == states.FAILURE and self.failure_expires else self.expires
        return int(expires or 86400)

    def _store_result(self, task_id, result, state, traceback=None, request=None, **kwargs):
        """Celery's, without its read of the stored result first (one round trip per job): store_once.lua
        already refuses to write over a final state."""
        if state in states.EXCEPTION_STATES and isinstance(result, dict):
            packed = take_captured(bytes_to_str(task_id))  # the exception as the job raised it (remote_errors.py)
            if packed is not None:
                result = dict(result, **{RECORD_KEY: packed})
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        try:
            with signing.sealed_to(owner_of(request)):  # a user's job: its result opens with its owner's token only
                value = self.encode(meta)
        except EncodeError as err:  # the job's return value, not its arguments: say so (Celery stores this)
            if state != states.SUCCESS:
                raise
            raise EncodeError(unsendable_result(result, err)) from err
        if self._store_later(task_id, value, state, request):
            return result
        later = getattr(_tracing, "later", None)
        if later and len(later) == 2 and later[0] == bytes_to_str(task_id):
            # A success left for later, then another state for the same job (a Task.on_success that raised):
            # the success goes first, as it did before, and store_once.lua keeps it.
            backend, store = later.pop()
            backend.store_now(store)
        try:
            self._set_with_state(self.get_key_for_task(task_id), value, state)
        except BackendStoreError as ex:
            raise BackendStoreError(str(ex), state=state, task_id=task_id) from ex
        return result

    def _store_later(self, task_id, value, state, request) -> bool:
        """Leave a traced job's success to the worker's main process (see the module's docstring)?"""
        later = getattr(_tracing, "later", None)
        if (later is None or len(later) != 1 or bytes_to_str(task_id) != later[0] or state != states.SUCCESS
                or len(value) > STORE_LATER_MAX or any(getattr(request, name, None) for name in _CANVAS)):
            return False
        job_id = later[0]
        later.append((self, (bytes_to_str(self.get_key_for_task(job_id)), keys.job_done(job_id), value,
                             self._expires(state))))
        return True

    def store_now(self, store: tuple) -> None:
        """Store what :meth:`_store_later` left, in this process (where no take can carry it)."""
        key, done, value, expires = store
        self.ensure(self._store_once_at, (key, done, value, expires, "1"))

    def _store_once(self, key, job_id, value, expires, final):
        return self._store_once_at(key, keys.job_done(job_id), value, expires, final)

    def _store_once_at(self, key, done, value, expires, final):
        if getattr(self, "_store_script", None) is None:
            self._store_script = load_script(self.client, "store_once")
        # durability = "replicated": WAIT on the same connection; a miss is logged, and the job's ack (sent
        # after this) may still go: a result lost in a failover reruns its job.
        waits = durability.from_options(self.app.conf.broker_transport_options)
        if not durability.worker_waits(waits, self.client):
            return self._store_script(keys=[key, done], args=[value, expires, final])
        reply, acked = durability.call_script(self.client, self._store_script, [key, done], [value, expires, final],
                                              waits)
        durability.worker_confirm(acked, waits, f"the result {key}", self.client)
        return reply

    def _get_result_meta(self, result, state, traceback, request, format_date=True, encode=False):
        if self._extended:
            meta = super()._get_result_meta(result, state, traceback, request, format_date=format_date, encode=encode)
        else:  # Celery's without result_extended, without its look-up of that setting for every result (6% of a
            # tiny job's time in its pool process)
            date_done = None
            if state in self.READY_STATES:
                date_done = self.app.now()
                if format_date:
                    date_done = date_done.isoformat()
            meta = {"status": state, "result": result, "traceback": traceback,
                    "children": self.current_task_children(request), "date_done": date_done}
            if request and getattr(request, "group", None):
                meta["group_id"] = request.group
            if request and getattr(request, "parent_id", None):
                meta["parent_id"] = request.parent_id
        if state in states.EXCEPTION_STATES:
            if "worker" not in meta:
                host = getattr(request, "hostname", None)  # the Celery node name, "<worker id>@<host>"
                if host:
                    meta["worker"] = str(host).split("@", 1)[0]
            policy = getattr(request, retries.HEADER, None) if state != states.REVOKED else None
            if policy and (policy["count"] or state == states.RETRY):
                # Sent with max_retries: a failure after retries names every try, a RETRY the tries so far.
                last = retries.after_try(policy, retries.describe(result, meta.get("worker")))
                meta["tries"] = {"total": last["count"], "outcomes": last["tries"]}
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
        if meta.get("status") in states.EXCEPTION_STATES and isinstance(meta.get("result"), dict) \
                and "exc_type" in meta["result"]:
            # Celery's record of the exception, and the worker's pack of it (remote_errors.py): the error keeps
            # the job's own type where this process can import it.
            meta["result"] = from_record(meta["result"], meta.get("traceback"), meta.get("task_id"),
                                         meta.get("worker"), self.exception_to_python)
            meta["traceback"] = meta["result"].traceback or meta.get("traceback")  # (AsyncResult.traceback too)
            return meta
        meta = super().meta_from_decoded(meta)
        if meta.get("status") in states.EXCEPTION_STATES and isinstance(meta.get("result"), BaseException):
            meta["result"] = err = as_job_failed(meta["result"], meta.get("traceback"), meta.get("task_id"),
                                                 meta.get("worker"))
            tries = meta.get("tries")
            if tries and not err.tries:
                err.tries, err.try_count = tuple(tries.get("outcomes") or ()), int(tries.get("total") or 0)
        return meta


def prime_result(handle, meta: dict) -> None:
    """Give a result handle the job's stored meta, as Celery does when a result arrives
    (``AsyncResult._maybe_set_cache``: a finished job's ``get`` then needs no subscription)."""
    handle._maybe_set_cache(meta)
