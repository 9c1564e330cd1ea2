"""gpulayer's kombu transport: Redis as kombu uses it, with takes that a SIGKILL cannot lose.

It overrides kombu 5.7's Redis ``Channel`` (``_put``, ``_do_restore_message``, ``_brpop_start``,
``_brpop_read``, ``conn_or_acquire``, ``close``), ``QoS`` (``append``, ``ack``, ``can_consume``) and
``Transport.register_with_event_loop`` (a cheaper loop turn: ``engine/loop.py``); ``engine/upstream.py`` pins each
to its source.

kombu's Redis transport takes a message with BRPOP and records it in its
``unacked`` hash with a second command; a worker killed between the two loses
the message for good (benchmarks/soak.py saw it once in 10,000 jobs with 34
SIGKILLs). Here a worker takes with one Lua script (``store/lua/take.lua``) that
pops the next messages of its queues and, in the same step, writes kombu's
unacked entry and the worker's delivery record (``keys.inflight``) for each. At
every instant a message is in a queue, or unacked with a record; the janitor
hands back the latter when their worker dies (worker/janitor.py). The same
script carries the results and acks of the jobs the worker finished since its
last take (engine/carry.py), and a take brings messages ahead of the worker's
free slots while no gang holds slots here (engine/prefetch.py: they wait on the
worker, recorded, and go back when a gang needs the slots).

A script cannot block, so an idle worker blocks on its queues' bells
(engine/bells.py) and takes when one rings, or after ``brpop_timeout`` (1 s)
anyway, which covers messages put back by anything that does not ring. While
takes fill their batch, the worker takes again without waiting.

With ``durability = "replicated"`` (store/durability.py) a publish, and a script that stores results or acks
jobs, is followed by ``WAIT`` on the same connection (in the same send, for a take).

Clients publish through the same transport (for the bells); only a process that
called :func:`consume_as` (the worker) takes this way, everything else consumes
as kombu does.
"""

from __future__ import annotations

import hashlib
import logging
import os
from contextlib import contextmanager
from importlib import resources
from queue import Empty
from time import monotonic, time
from urllib.parse import urlsplit

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kredis
from kombu.exceptions import DecodeError
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps

from .. import queues, signing
from ..errors import ConfigError, PayloadRejected
from ..store import durability, fair, keys
from . import batches, senders, takeover
from .senders import CLIENT_HEADER
from .bells import BELL_TOKENS, ring
from .carry import Carry
from .envelope import loads_message
from .loop import add_readers_only_when_missing, remove_writers_only_if_added
from .prefetch import BURST_DRAIN, BURST_MAX, Prefetch  # noqa: F401 (BURST_*: the take's sizes, read by tests)
from .qos import QoS
from .redis_tls import TLSConnection
from .sentinel import SentinelPools

log = logging.getLogger(__name__)

NAME = "gpulayer"
TAKE = resources.files("gpulayer.store").joinpath("lua", "take.lua").read_text()
TAKE_SHA = hashlib.sha1(TAKE.encode()).hexdigest()  # sent by digest: the script's 3 KB travel once per server

_consumer: str | None = None  # this worker process's life (keys.life), once it consumes


def consume_as(worker_id: str | None, pid: int | None = None) -> None:
    """Take messages as this life of ``worker_id`` (the worker's main process calls this before consuming)."""
    global _consumer
    _consumer = keys.life(worker_id, pid or os.getpid()) if worker_id else None


JOB_QUEUES = f"{keys.NAMESPACE}.q."  # every queue of jobs (gpulayer/queues.py), gl.q.control included


UNREAD = ((), {}, {})  # a job's (args, kwargs, embed) as the worker's main process sees them: never read there
args_read_in_main = False  # Celery's result_extended stores a job's args with a failure the main process stores


class Message(virtual.Message):
    """kombu's message, whose body a job's request in the worker's main process does not decode.

    Celery's ``Request`` decodes every message's body (for a job: its signature checked, its function and
    arguments unpickled) only to hand the decoded arguments to the pool process, which decodes the body again
    and uses its own. For a job's message here, the main process's copy is :data:`UNREAD` (its summaries,
    ``argsrepr`` and ``kwargsrepr``, are what it shows: engine/request.py ``info``), unless Celery's
    ``result_extended`` is on. Its signature is checked here all the same, so a forged message is refused on
    receipt and logged with its origin, as kombu's decode refuses it. kombu's ``Message._decode`` is pinned in
    engine/upstream.py.
    """

    def _decode(self):
        if not args_read_in_main and self.headers.get("task") == batches.TASK and \
                self.content_type == signing.CONTENT_TYPE:
            try:  # its signature is still checked here: a forged message is refused on receipt, as before
                signing.verify(self.body)
                check_sender(self.headers)
            except Exception as err:
                raise DecodeError(err) from err
            return UNREAD
        decoded = super()._decode()
        if self.content_type == signing.CONTENT_TYPE:
            try:
                check_sender(self.headers)
            except PayloadRejected as err:
                raise DecodeError(err) from err
        return decoded


def check_sender(headers: dict) -> None:
    """A job signed by a user names that user as its sender (``CLIENT_HEADER``), or is refused: the header,
    outside the signature, is what cancels, results and `--all-mine` go by. A job signed by the cluster (a
    worker's retry or chain step, an admin holding the secret) may name any sender."""
    signer = signing.last_signer()
    if signer is not None and headers.get("task") and headers.get(CLIENT_HEADER) != signer:
        raise PayloadRejected(f"job {headers.get('id')} is signed by user {signer!r} but names "
                              f"{headers.get(CLIENT_HEADER)!r} as its sender; refused")


class Channel(Prefetch, SentinelPools, kredis.Channel):
    """kombu's Redis channel, taking with take.lua; its prefetched messages are engine/prefetch.py's, the acks
    and results its scripts carry engine/carry.py's, its pools on a Sentinel group engine/sentinel.py's."""

    _takes_jobs = False  # set once it consumed a job queue (_taking)

    QoS = QoS  # engine/qos.py: acks that ride on the next take, and the worker's slot gate
    Message = Message  # a job's body decoded by its pool process only
    connection_class_ssl = TLSConnection  # rediss://: one TLS context per process (engine/redis_tls.py)

    def __init__(self, *args, **kwargs):
        self._pool_client = None  # before kombu's __init__, which may already talk to Redis
        self._poll_command: str | None = None
        self._waits = False  # the script in flight is followed by a WAIT whose reply is read after its own
        self._take_sent: list = []  # the arguments of the take script in flight (sent again whole on NOSCRIPT)
        transport = args[0] if args else kwargs["connection"]
        self._use_sentinel(transport)
        # What an acknowledged write means (store/durability.py): publishes, and the scripts that store and ack.
        self.durability = durability.from_options(transport.client.transport_options)
        super().__init__(*args, **kwargs)
        self._recorded: dict[str, bool] = {}
        self._poll_keys: list[str] = []
        self._carry = Carry()
        self._fair = fair.Order()  # users' lists first, by fair-share rank, while a policy exists (store/fair.py)
        self._init_prefetch()

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
        bell_key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        batch = kwargs.get("_publish_batch")
        user = (message.get("headers") or {}).get(senders.CLIENT_HEADER) if queue != queues.CONTROL else None
        with self.conn_or_acquire() as client:  # a user with a policy: its own list (store/fair.py)
            key = fair.queue_key(client, bell_key, user)
        if batch is not None:
            if key == bell_key:
                super()._put(queue, message, **kwargs)
            else:
                batch.add("lpush", key, dumps(message))
            senders.record(batch, message)
            rung = batch.__dict__.setdefault("_gpulayer_rung", {})
            if rung.get(bell_key, 0) < BELL_TOKENS:  # a bigger batch wakes no more workers
                rung[bell_key] = rung.get(bell_key, 0) + 1
                ring(batch, bell_key)
            return
        with self.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
            pipe.lpush(key, dumps(message))
            senders.record(pipe, message)  # who sent it, for `gpulayer cancel` (no round trip more)
            if self._expires and queue in self._expires:
                for p in self.priority_steps:
                    pipe.pexpire(self._q_for_pri(queue, p), self._expires[queue])
            ring(pipe, bell_key)
            job_id = (message.get("headers") or {}).get("id")  # a job's (not a control reply's)
            waits = durability.planned(self.durability, client) if job_id else durability.NONE
            if waits:  # on the same connection: returns once a replica has the message
                pipe.execute_command(*waits.command())
            acked = pipe.execute()[-1]
        durability.confirm(acked, waits, "publish", (job_id,), client)

    def _do_restore_message(self, payload, exchange, routing_key, pipe, leftmost=False):
        user = (payload.get("headers") or {}).get(senders.CLIENT_HEADER) if isinstance(payload, dict) else None
        if any(queue == queues.CONTROL for queue in self._lookup(exchange, routing_key)):
            user = None  # (the control consumer reads its queue's own list only)
        with self.conn_or_acquire() as client:
            has_policy = bool(user) and user in fair.policies(client)
        if not has_policy:
            super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        else:  # back to its user's list, as kombu restores one to its queue (marked redelivered)
            for part in ("headers", "properties"):
                target = payload.get(part) if part == "headers" else (payload.get(part) or {}).get("delivery_info")
                if isinstance(target, dict):
                    target["redelivered"] = True
            for queue in self._lookup(exchange, routing_key):
                key = self._q_for_pri(queue, self._get_message_priority(payload, reverse=False))
                (pipe.lpush if leftmost else pipe.rpush)(keys.user_queue(key, user), dumps(payload))
        for queue in self._lookup(exchange, routing_key):
            ring(pipe, self._q_for_pri(queue, self._get_message_priority(payload, reverse=False)))

    # -- taking -------------------------------------------------------------------------------
    def _taking(self) -> bool:
        """Does this channel take jobs (the atomic take, with delivery records)? Only the worker's channel that
        consumes job queues: a reply queue read in the worker's process (its own ``ping`` broadcast, an
        ``inspect`` it sends) is read with kombu's plain BRPOP, and is no sign that kombu reconnected.

        Once a channel consumed job queues it stays a taker: a warm shutdown cancels its consumers (no active
        queue left) before it closes the channel, and ``close`` must still give back what it prefetched."""
        if _consumer is None or self.global_keyprefix:
            return False
        if not self._takes_jobs and any(q.startswith(JOB_QUEUES) for q in self.active_queues):
            self._takes_jobs = True
        return self._takes_jobs

    def _records_key(self) -> str | None:
        """This worker life's delivery records (``keys.inflight``); None in a process that does not take."""
        return keys.inflight(_consumer) if _consumer is not None else None

    def _sweep_later(self) -> None:
        takeover.recheck_later()  # (what a failed round trip left recorded goes back before the next take)

    def _brpop_start(self, timeout=None):
        if not self._taking():
            self._poll_command = None
            return super()._brpop_start(timeout)
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        if takeover.must_recheck(self):  # kombu reconnected, or a round trip failed
            with self.conn_or_acquire() as client:
                takeover.hand_back_dropped(client, self._records_key(), [*self._buffered_tags(), *self._carry.acks],
                                           self.qos.restore_by_tag)
        self._deliver_buffered()  # what an earlier take brought, before asking Redis for more
        if (self._buffer or not self.qos.may_deliver()) and not self._refill():
            if not self._results_due():
                return
            self._poll_keys = []  # results to store (with the acks that wait), nothing to take
        else:
            # Higher priority first (gpulayer's one convention for jobs and gangs): kombu's highest step's list,
            # its base list (no priority, or 0) last. kombu itself serves step 0 first. Users' lists first while
            # a fair-share policy exists (store/fair.py).
            with self.conn_or_acquire() as client:
                self._poll_keys = self._fair.keys(client, [self._q_for_pri(q, pri)
                                                           for pri in sorted(self.priority_steps, reverse=True)
                                                           for q in queues])
        if self._taking_again or self._carry:
            self._poll_command = "EVAL"
            self._take_sent = self._take_args()
            args = ["EVALSHA", TAKE_SHA, *self._take_sent]
        else:
            self._poll_command = "BRPOP"
            args = ["BRPOP", *[keys.bell(k) for k in self._poll_keys if keys.USER_SEP not in k], timeout or 0]
        self._waits = args[0] == "EVAL" and self._carry_waits()
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        try:
            self.client.connection.send_command(*args)
            if self._waits:  # on the same connection: its reply follows the script's
                self.client.connection.send_command(*self.durability.command())
        except self.connection_errors:
            self._waits = False
            takeover.recheck_later()
            raise

    def _take_args(self, queue_keys=None) -> list:
        """take.lua's arguments: this worker's queues and records, how many to take, and the results and acks
        it carries."""
        result_keys, result_args, n_results, acks = self._carry.send()
        queue_keys = self._poll_keys if queue_keys is None else queue_keys
        want = self._batch_size() if queue_keys else 0
        return [len(queue_keys) + 3 + len(keys.FAIR_KEYS) + len(result_keys), *queue_keys, self.unacked_key,
                self.unacked_index_key, self._records_key(), *keys.FAIR_KEYS, *result_keys, want, time(), n_results,
                fair.half_life, *result_args, *acks]

    def _brpop_read(self, **options):
        command, self._poll_command = self._poll_command, None
        if command is None:
            return super()._brpop_read(**options)
        try:
            try:
                try:
                    reply = self.client.parse_response(self.client.connection, command, **options)
                except redis.ResponseError as err:  # the script's error: the WAIT's reply follows all the same
                    self._read_wait()
                    if not isinstance(err, redis.exceptions.NoScriptError):
                        raise
                    reply = self._eval_take(self._take_sent, whole=True)  # a server new to it (restarted, failed over)
                else:
                    self._read_wait()
                if command == "BRPOP":  # a bell rang, or the wait timed out: take now either way
                    if not self.qos.may_deliver() and not self._refill():  # shut meanwhile (a gang): take once it opens
                        self._taking_again = True
                        raise Empty()
                    reply = self._eval_take(self._take_args())
            except self.connection_errors:
                self._waits = False
                takeover.recheck_later()  # the take may have happened, its reply lost: handed back after the reconnect
                self.client.connection.disconnect()
                raise
            finally:
                # Done, or (connection lost) handed back after the reconnect: the jobs run again, and store once.
                self._carry.sent()
            if self._poll_keys:  # (a script that only stored results took nothing)
                self._taking_again = len(reply) >= 2 * self._batch_size()
                if not self._taking_again:  # the queues ran dry: whatever comes next starts from the base
                    self._burst = 1
            taken = (self._taken(reply[i], reply[i + 1]) for i in range(0, len(reply), 2))
            self._buffer_taken([t for t in taken if t is not None])
            if not self._deliver_buffered():
                raise Empty()
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _taken(self, queue_key: bytes, item: bytes) -> tuple[bytes, bytes, dict] | None:
        try:
            message = loads_message(item)
            props = message["properties"]
            tag = props["delivery_tag"]
        except (ValueError, KeyError, TypeError):
            log.error("gpulayer: dropped a message on %s that is not a kombu message: %r", bytes_to_str(queue_key),
                      item[:200])
            return None
        if isinstance(tag, str) and props.get("delivery_info"):
            self._recorded[tag] = True  # take.lua wrote its unacked entry and delivery record
        return queue_key, item, message

    # -- results and acks: carried by the next script (engine/carry.py) ---------------------------
    def store_later(self, store: tuple) -> bool:
        """Store a job's result (``results.StoreLater.store``) with the next script this channel sends: on this
        turn of the event loop, or, within ``RESULTS_EVERY`` of the last results sent, with the others that
        come meanwhile (a take sent before then carries them too). False where this channel does not take
        (the caller stores it itself)."""
        if not self._taking() or self.closed or self._closing:
            return False
        self._carry.results.append(store)
        waiting_on_bell = self._in_poll and self._poll_command == "BRPOP"  # no script goes before it rings
        if waiting_on_bell or not self._carry.wake_when_due(busy=bool(self._buffer)):
            self._flush_held()
        return True

    def _carry_waits(self) -> bool:
        """Does the script about to go (its ``_take_args`` taken) store results or ack jobs, and should a WAIT
        follow it (``durability = "replicated"``, and no recent miss in this worker)?"""
        if not (self._carry.acks_sent or self._carry.results_sent) or not self.durability:
            return False
        with self.conn_or_acquire() as client:  # (whether a replica is in sync: read at most once a second)
            return durability.worker_waits(self.durability, client)

    def _read_wait(self) -> None:
        """Read the reply of the WAIT sent after the script in flight, if one was."""
        if self._waits:
            self._waits = False
            try:
                acked = self.client.parse_response(self.client.connection, "WAIT")
            except redis.ResponseError:  # (a server that is a replica now: nothing confirmed)
                acked = 0
            self._replicated(acked)

    def _replicated(self, acked) -> None:
        carried = self._carry
        with self.conn_or_acquire() as client:
            durability.worker_confirm(acked, self.durability, f"the script that stored {len(carried.results_sent)} "
                                      f"result(s) and acked {len(carried.acks_sent)} job(s)", client)

    def _eval_take(self, args: list, whole: bool = False):
        """take.lua with ``args`` on the pool's client, by digest (``whole``: its text, which loads it); followed by
        a WAIT on the same connection where :meth:`_carry_waits` says so. Its reply."""
        with self.conn_or_acquire() as client:
            if not whole:
                try:
                    return self._eval_take_on(client, ("EVALSHA", TAKE_SHA), args)
                except redis.exceptions.NoScriptError:  # (the script did not run: sent again whole)
                    pass
            return self._eval_take_on(client, ("EVAL", TAKE), args)

    def _eval_take_on(self, client, script: tuple, args: list):
        if not self._carry_waits():
            return client.execute_command(*script, *args)
        with client.pipeline(transaction=False) as pipe:
            pipe.execute_command(*script, *args)
            pipe.execute_command(*self.durability.command())
            reply, acked = pipe.execute()
        self._replicated(acked)
        return reply

    def _results_due(self) -> bool:
        return self._carry.results_due(busy=bool(self._buffer))

    def _between_takes(self) -> None:
        """Each time kombu asks whether to consume: the buffer goes back when a gang holds slots here or it
        waited too long; acks that waited too long go alone."""
        self._give_back_if_unwanted()
        if self._carry.acks_overdue():
            self._flush_held()

    def _flush_held(self) -> None:
        """Send the results and acks this channel holds now, in a script of their own that takes nothing."""
        try:
            self._eval_take(self._take_args(queue_keys=[]))
        except self.connection_errors as err:  # again with the next take (an ack twice is once, a result too)
            log.warning("gpulayer: could not ack %d finished job(s) yet (%s)", len(self._carry.acks_sent), err)
            self._carry.unsent()
        finally:
            self._carry.sent()

    def close(self):
        """Before kombu closes the channel: read a take still in flight, give back what was never started, and
        send the acks that wait.

        A wait on the bells still in flight is dropped with its connection, not waited out (up to
        ``brpop_timeout``, which a stopping worker spent in most runs of `gpulayer down`): it takes no message, and a
        token it may have popped only wakes another idle worker up to that timeout later (``bells.py``)."""
        if self._taking() and not self.closed:
            self._closing = True  # nothing more is handed to Celery
            try:
                if self._in_poll and self._poll_command == "BRPOP":
                    self._in_poll = self._poll_command = None
                    self.client.connection.disconnect()
                elif self._in_poll:
                    try:
                        self._brpop_read()
                    except Empty:
                        pass
                self._give_back()
                if self._carry:
                    self._flush_held()
            except self.connection_errors as err:
                log.warning("gpulayer: closing the channel without reaching Redis (%s)", err)
        super().close()


class Transport(kredis.Transport):
    Channel = Channel

    def register_with_event_loop(self, connection, loop):
        """kombu's, with a cheaper turn of the event loop (``engine/loop.py``)."""
        before = set(loop.on_tick)
        super().register_with_event_loop(connection, loop)
        added = [tick for tick in loop.on_tick if tick not in before]
        if len(added) == 1:  # kombu's one on_poll_start (anything else: leave kombu's as it is)
            add_readers_only_when_missing(loop, self.cycle, self.on_readable, added[0])
            remove_writers_only_if_added(loop)


# TCP and TLS: kombu's Redis channel, and so these takes, serve both; a Sentinel group's URL reaches kombu as a
# redis:// or rediss:// one (engine/sentinel.py's engine_url).
SCHEMES = ("redis", "rediss")


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
