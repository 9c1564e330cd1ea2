"""gpulayer's kombu transport: Redis as kombu uses it, with takes that a SIGKILL cannot lose.

It overrides kombu 5.7's Redis ``Channel`` (``_put``, ``_do_restore_message``, ``_brpop_start``,
``_brpop_read``, ``conn_or_acquire``) and ``QoS``; ``engine/upstream.py`` pins each to its source.

kombu's Redis transport takes a message with BRPOP and records it in its
``unacked`` hash with a second command; a worker killed between the two loses
the message for good (benchmarks/soak.py saw it once in 10,000 jobs with 34
SIGKILLs). Here a worker takes with one Lua script (``store/lua/take.lua``) that
pops the next message of its queues and keeps a copy in the worker's taking
list; the next command, one MULTI, writes kombu's unacked entry and the
worker's delivery record (``keys.inflight``) and drops the copy. At every instant
the message is in a queue, in a taking list, or unacked with a record; the
janitor hands back the last two when their worker dies (worker/janitor.py). The
record goes away with the ack, in the same command as kombu's unacked entry.

A script cannot block, so an idle worker blocks on its queues' *bells* (a list
per queue; every publish through this transport pushes a token, capped at
``BELL_TOKENS``) and takes when one rings, or after ``brpop_timeout`` (1 s)
anyway, which covers messages put back by anything that does not ring. While
takes find messages, the worker takes again without waiting.

Clients publish through the same transport (for the bells); only a process that
called :func:`consume_as` (the worker) takes this way, everything else consumes
as kombu does.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from importlib import resources
from queue import Empty
from time import monotonic, time
from urllib.parse import urlsplit

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kredis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

from ..errors import ConfigError
from ..store import keys
from ..store.connection import TLSConnection

log = logging.getLogger(__name__)

NAME = "gpulayer"
BELL_TOKENS = 64  # tokens kept per bell: enough to wake every idle worker of a queue at once
_LUA = resources.files("gpulayer.store").joinpath("lua")
TAKE = _LUA.joinpath("take.lua").read_text()
PUT_BACK = _LUA.joinpath("put_back.lua").read_text()

_consumer: str | None = None  # this worker process's life (keys.life), once it consumes
# Check this life's taking list before the next take: at start, and after any failed round trip (a take
# whose reply was lost leaves its message there, and this worker, alive, is not the janitor's business).
_sweep_taking = True
_channels = 0  # channels made in this process: more than one means kombu reconnected


def consume_as(worker_id: str | None, pid: int | None = None) -> None:
    """Take messages as this life of ``worker_id`` (the worker's main process calls this before consuming)."""
    global _consumer
    _consumer = keys.life(worker_id, pid or os.getpid()) if worker_id else None


def copy_of(queue_key: bytes, item: bytes) -> bytes:
    """The taking list's entry for ``item`` taken from ``queue_key`` (as take.lua writes it)."""
    return queue_key + b"\n" + item


def split_copy(entry: bytes) -> tuple[bytes, bytes]:
    queue_key, _, item = entry.partition(b"\n")
    return queue_key, item


def put_back_taking(client, life: str) -> list[bytes]:
    """Requeue what ``life``'s taking list holds (taken, never recorded); returns the messages put back.

    Only when no take of that life is under way: the janitor's dead workers, a worker's earlier lives, or
    the consumer itself between takes.
    """
    done = []
    for entry in client.lrange(keys.taking(life), 0, -1):
        queue_key, item = split_copy(entry)
        if client.eval(PUT_BACK, 2, keys.taking(life), queue_key, entry, item):
            pipe = client.pipeline(transaction=False)
            ring(pipe, queue_key)
            pipe.execute()
            done.append(item)
    return done


def _mark_sweep() -> None:
    global _sweep_taking
    _sweep_taking = True


def ring(pipe, queue_key) -> None:
    """Add a wake-up token for ``queue_key``'s idle takers to ``pipe`` (a pipeline or a publish batch)."""
    add = pipe.add if isinstance(pipe, kredis.PublishBatch) else (lambda name, *a: getattr(pipe, name)(*a))
    add("lpush", keys.bell(bytes_to_str(queue_key)), 1)
    add("ltrim", keys.bell(bytes_to_str(queue_key)), 0, BELL_TOKENS - 1)


class QoS(kredis.QoS):
    def append(self, message, delivery_tag):
        if self.channel._recorded.pop(delivery_tag, None):  # the take wrote unacked and the record already
            virtual.QoS.append(self, message, delivery_tag)
        else:
            super().append(message, delivery_tag)

    def _remove_from_indices(self, delivery_tag, pipe=None):
        pipe = super()._remove_from_indices(delivery_tag, pipe)
        if _consumer is not None:
            pipe.hdel(keys.inflight(_consumer), delivery_tag)
        return pipe


class Channel(kredis.Channel):
    QoS = QoS
    connection_class_ssl = TLSConnection  # rediss://: one TLS context per process (store/connection.py)

    def __init__(self, *args, **kwargs):
        self._pool_client = None  # before kombu's __init__, which may already talk to Redis
        super().__init__(*args, **kwargs)
        self._recorded: dict[str, bool] = {}
        self._taking_again = False  # the last take found a message: take again without waiting
        self._poll_command: str | None = None
        self._poll_keys: list[str] = []
        global _channels
        _mark_sweep()  # a new channel: at start, or after kombu reconnected
        _channels += 1

    @contextmanager
    def conn_or_acquire(self, client=None):
        """kombu builds a new redis-py client (~170 response callbacks) for every publish, take and ack;
        here one client per connection pool serves them all (the pool hands out the connections)."""
        if client:
            yield client
            return
        pool = self.pool  # kombu drops its pools after a fork: a new pool gets a new client
        if self._pool_client is None or self._pool_client.connection_pool is not pool:
            self._pool_client = self._create_client()
        yield self._pool_client

    # -- publishing: every message rings its queue's bell -----------------------------------
    def _put(self, queue, message, **kwargs):
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        batch = kwargs.get("_publish_batch")
        if batch is not None:
            super()._put(queue, message, **kwargs)
            rung = batch.__dict__.setdefault("_gpulayer_rung", {})
            if rung.get(key, 0) < BELL_TOKENS:  # a bigger batch wakes no more workers
                rung[key] = rung.get(key, 0) + 1
                ring(batch, key)
            return
        with self.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
            pipe.lpush(key, dumps(message))
            if self._expires and queue in self._expires:
                for p in self.priority_steps:
                    pipe.pexpire(self._q_for_pri(queue, p), self._expires[queue])
            ring(pipe, key)
            pipe.execute()

    def _do_restore_message(self, payload, exchange, routing_key, pipe, leftmost=False):
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        for queue in self._lookup(exchange, routing_key):
            ring(pipe, self._q_for_pri(queue, self._get_message_priority(payload, reverse=False)))

    # -- taking -------------------------------------------------------------------------------
    def _taking(self) -> bool:
        return _consumer is not None and not self.global_keyprefix

    def _brpop_start(self, timeout=None):
        if not self._taking():
            self._poll_command = None
            return super()._brpop_start(timeout)
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        if _sweep_taking:
            self._put_back_lost_takes()
        self._poll_keys = [self._q_for_pri(q, pri) for pri in self.priority_steps for q in queues]
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        if self._taking_again:
            self._poll_command = "EVAL"
            args = ["EVAL", TAKE, len(self._poll_keys) + 1, *self._poll_keys, keys.taking(_consumer)]
        else:
            self._poll_command = "BRPOP"
            args = ["BRPOP", *[keys.bell(k) for k in self._poll_keys], timeout or 0]
        try:
            self.client.connection.send_command(*args)
        except self.connection_errors:
            _mark_sweep()
            raise

    def _brpop_read(self, **options):
        command, self._poll_command = self._poll_command, None
        if command is None:
            return super()._brpop_read(**options)
        try:
            try:
                reply = self.client.parse_response(self.client.connection, command, **options)
                if command == "BRPOP":  # a bell rang, or the wait timed out: take now either way
                    with self.conn_or_acquire() as client:
                        reply = client.eval(TAKE, len(self._poll_keys) + 1, *self._poll_keys,
                                            keys.taking(_consumer))
            except self.connection_errors:
                _mark_sweep()  # the take may have happened with its reply lost
                self.client.connection.disconnect()
                raise
            self._taking_again = bool(reply)
            if not reply:
                raise Empty()
            queue_key, item = reply
            message = self._record(queue_key, item)
            dest = bytes_to_str(queue_key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            self.connection._deliver(message, dest)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _record(self, queue_key: bytes, item: bytes) -> dict:
        """Write kombu's unacked entry and our delivery record, and drop the taking copy, in one MULTI."""
        message = loads(bytes_to_str(item))
        props = message["properties"]
        tag, info = props["delivery_tag"], props["delivery_info"]
        job_id = (message.get("headers") or {}).get("id")
        try:
            with self.conn_or_acquire() as client:
                pipe = client.pipeline()
                pipe.zadd(self.unacked_index_key, {tag: time()})
                pipe.hset(self.unacked_key, tag, dumps([message, info["exchange"], info["routing_key"]]))
                if job_id:
                    pipe.hset(keys.inflight(_consumer), tag, job_id)
                pipe.lrem(keys.taking(_consumer), 1, copy_of(queue_key, item))
                pipe.execute()
        except self.connection_errors:
            _mark_sweep()  # in our taking list (swept), or recorded after all (handed back after the reconnect)
            raise
        self._recorded[tag] = True
        return message

    def _put_back_lost_takes(self) -> None:
        global _sweep_taking
        with self.conn_or_acquire() as client:
            for item in put_back_taking(client, _consumer):
                log.warning("gpulayer: put back a message whose take lost its reply (Redis went away)")
            if _channels > 1:
                self._hand_back_dropped(client)
        _sweep_taking = False

    def _hand_back_dropped(self, client) -> None:
        """After a reconnect: requeue what this life recorded but the worker no longer holds.

        Celery drops the requests it had taken but not started when its broker connection breaks,
        counting on the broker to deliver them again (for Redis: after the visibility timeout).
        """
        from celery.worker import state  # the worker's own requests; this runs in its consumer

        held = {getattr(getattr(r, "_message", None), "delivery_tag", None)
                for r in (*state.active_requests, *state.reserved_requests)}
        for raw in client.hkeys(keys.inflight(_consumer)):
            tag = bytes_to_str(raw)
            if tag not in held and client.hdel(keys.inflight(_consumer), tag):
                self.qos.restore_by_tag(tag, client)
                log.warning("gpulayer: requeued message %s, dropped by the worker when Redis went away", tag)


class Transport(kredis.Transport):
    Channel = Channel


SCHEMES = ("redis", "rediss")  # TCP and TLS: kombu's Redis channel, and so these takes, serve both


def transport_for(url: str) -> str:
    """This transport's name for a broker URL it serves; a clear error for any other, never kombu's transport
    instead (whose takes a SIGKILL can lose)."""
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise ConfigError(f"the broker URL's scheme {scheme}:// has no transport with SIGKILL-safe takes; "
                          "use redis://host:port/db, or rediss://host:port/db for TLS")
    return NAME


# Celery's setting ``broker_transport="gpulayer"`` (set by gpulayer.app for redis:// and rediss:// URLs) names
# this class; logs show the broker as gpulayer://:**@host:port/db.
TRANSPORT_ALIASES.setdefault(NAME, f"{__name__}:Transport")
