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
script first stores the results the worker's main process holds (a small
success comes back from the job's process unstored, engine/results.py
``StoreLater``), then acks the jobs the worker finished since its last take
(a result is stored before, or with, its ack, so a worker that dies with acks
unsent leaves messages that come back and are ignored as done), so a steady
stream of jobs costs the worker one round trip per take, not three per job.
Results go on the loop turn they come back on, or with the others that come
within ``RESULTS_EVERY`` of the last ones sent (``RESULTS_EVERY_BUSY`` while
prefetched messages wait on the worker, whose next take soon carries them), in
a script of their own when no take is due.

While no gang holds slots on the worker, a take brings up to free slots x
``prefetch_multiplier`` messages (up to ``BURST_MAX`` times that while full takes
start all their messages within ``BURST_DRAIN``: tiny jobs); the ones beyond the
free slots wait in the channel, recorded, and go to Celery one by one as slots
free up (the slot gate decides, as before). When a gang reserves slots here, the waiting ones go back
to the head of their queues, as taken, in one script (``store/lua/give_back.lua``),
before the gate lets anything else start; so do they when the worker stops.

A script cannot block, so an idle worker blocks on its queues' *bells* (a list
per queue; every publish through this transport pushes a token, capped at
``BELL_TOKENS``) and takes when one rings, or after ``brpop_timeout`` (1 s)
anyway, which covers messages put back by anything that does not ring. While
takes fill their batch, the worker takes again without waiting.

Clients publish through the same transport (for the bells); only a process that
called :func:`consume_as` (the worker) takes this way, everything else consumes
as kombu does.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from collections import deque
from contextlib import contextmanager
from importlib import resources
from queue import Empty
from time import monotonic, time
from urllib.parse import urlsplit

from kombu.asynchronous import get_event_loop
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kredis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

from ..errors import ConfigError
from ..store import keys
from .redis_tls import TLSConnection
from .loop import add_readers_only_when_missing, remove_writers_only_if_added

log = logging.getLogger(__name__)

NAME = "gpulayer"
BELL_TOKENS = 64  # tokens kept per bell: enough to wake every idle worker of a queue at once
ACK_WAIT = 0.2  # seconds a finished job's ack waits for a take to ride on before it goes alone
TURN_DELAY = 0.001  # seconds: kombu's loop takes a timer due after 0 as one a second away
RESULTS_EVERY = 0.002  # seconds: results that come within this long of the last ones sent go out together
RESULTS_EVERY_BUSY = 0.010  # the same while the worker holds prefetched messages: a take follows soon
BURST_MAX = 4  # a take brings up to this many times free slots x prefetch_multiplier while jobs are tiny
BURST_DRAIN = 0.05  # seconds: a full take whose messages all started within this long doubles the next (to
# BURST_MAX); one whose messages took over twice as long, or a take that found its queues dry, takes the base again
_LUA = resources.files("gpulayer.store").joinpath("lua")
TAKE = _LUA.joinpath("take.lua").read_text()
GIVE_BACK = _LUA.joinpath("give_back.lua").read_text()

_consumer: str | None = None  # this worker process's life (keys.life), once it consumes
# Look for what this life recorded but no longer holds, before the next take: after a round trip that failed (a
# take whose reply was lost), and when a new channel takes over from another (kombu reconnected, and Celery
# dropped what it had not started). Not for other channels of the process (the janitor's, publishers').
_recheck = False
_taker: "weakref.ref[Channel] | None" = None  # the channel that took last


def consume_as(worker_id: str | None, pid: int | None = None) -> None:
    """Take messages as this life of ``worker_id`` (the worker's main process calls this before consuming)."""
    global _consumer
    _consumer = keys.life(worker_id, pid or os.getpid()) if worker_id else None


def loads_message(item: bytes) -> dict:
    """kombu's JSON ``loads`` of a taken message, without its hook (a Python call per object, ~6 in a message)
    when no object in it can be one of kombu's tagged values (``{"__type__": ..., "__value__": ...}``: a datetime,
    a UUID, bytes, a Decimal), the only objects the hook changes."""
    if b"__type__" in item:
        return loads(bytes_to_str(item))
    return json.loads(item)


def _mark_sweep() -> None:
    global _recheck
    _recheck = True


def ring(pipe, queue_key) -> None:
    """Add a wake-up token for ``queue_key``'s idle takers to ``pipe`` (a pipeline or a publish batch)."""
    add = pipe.add if isinstance(pipe, kredis.PublishBatch) else (lambda name, *a: getattr(pipe, name)(*a))
    add("lpush", keys.bell(bytes_to_str(queue_key)), 1)
    add("ltrim", keys.bell(bytes_to_str(queue_key)), 0, BELL_TOKENS - 1)


class QoS(kredis.QoS):
    """kombu's Redis QoS, with acks that ride on the next take and the worker's slot gate.

    ``gate`` (engine/qos.py) is set on the consuming channel's QoS of a worker: kombu asks
    ``can_consume`` before every take and before reading a take's reply.
    """

    gate = None

    def append(self, message, delivery_tag):
        if self.channel._recorded.pop(delivery_tag, None):  # the take wrote unacked and the record already
            virtual.QoS.append(self, message, delivery_tag)
        else:
            super().append(message, delivery_tag)

    def ack(self, delivery_tag):
        """Celery acks once the result is stored (acks_late); the worker's ack goes with its next take."""
        channel = self.channel
        if not channel._taking():
            return super().ack(delivery_tag)
        if not channel._acks:
            channel._acks_since = monotonic()
        channel._acks.append(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)
        # Celery acks once it has freed the job's slot: the next buffered message starts now, from the pool's
        # result handler, so the pool sends it on this loop turn (from a tick it would wait for a timer).
        channel._deliver_buffered()

    def can_consume(self):
        channel = self.channel
        channel._between_takes()
        # A take's reply is read even while the gate is shut: its messages are recorded and buffered (then
        # handed back if a gang needs the slots), never left waiting in the socket for the gang's whole run.
        # Results the main process holds go out on this turn whether or not it may take more.
        return channel._poll_command == "EVAL" or channel._results_due() or self.may_deliver()

    def may_deliver(self) -> bool:
        """May the worker start one more message now (its slot gate, then kombu's prefetch count)?"""
        gate = self.gate
        return (gate is None or gate.free() > 0) and virtual.QoS.can_consume(self)

    def _remove_from_indices(self, delivery_tag, pipe=None):
        pipe = super()._remove_from_indices(delivery_tag, pipe)
        if _consumer is not None:
            pipe.hdel(keys.inflight(_consumer), delivery_tag)
        return pipe


class Channel(kredis.Channel):
    QoS = QoS
    connection_class_ssl = TLSConnection  # rediss://: one TLS context per process (engine/redis_tls.py)

    def __init__(self, *args, **kwargs):
        self._pool_client = None  # before kombu's __init__, which may already talk to Redis
        self._poll_command: str | None = None
        super().__init__(*args, **kwargs)
        self._recorded: dict[str, bool] = {}
        self._taking_again = False  # the last take filled its batch: take again without waiting
        self._poll_keys: list[str] = []
        self._buffer: deque[tuple[bytes, bytes, dict]] = deque()  # taken and recorded, not yet delivered
        self._acks: list[str] = []  # finished (result stored): acked in Redis by the next take
        self._acks_sent: list[str] = []
        self._acks_since = 0.0
        self._results: list[tuple] = []  # jobs' results to store (results.StoreLater): sent on this loop turn
        self._results_sent: list[tuple] = []
        self._results_at = 0.0  # when a script last carried results
        self._results_timer_set = False
        self._buffered_since = 0.0
        self._burst = 1  # the next take's size over free slots x prefetch_multiplier (_drained)
        self._turn_timer_set = False  # _turn_soon_if_acks_wait's timer is set
        self._handed = 0  # messages handed to Celery by _deliver_buffered, ever

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
        global _taker
        if _taker is None or _taker() is not self:
            if _taker is not None:
                _mark_sweep()  # a new channel takes over: kombu reconnected
            _taker = weakref.ref(self)
        if _recheck:
            self._recover_after_reconnect()
        self._deliver_buffered()  # what an earlier take brought, before asking Redis for more
        if self._buffer or not self.qos.may_deliver():
            if not self._results_due():
                return
            self._poll_keys = []  # results to store (with the acks that wait), nothing to take
        else:
            self._poll_keys = [self._q_for_pri(q, pri) for pri in self.priority_steps for q in queues]
        if self._taking_again or self._acks or self._results:
            self._poll_command = "EVAL"
            args = ["EVAL", TAKE, *self._take_args()]
        else:
            self._poll_command = "BRPOP"
            args = ["BRPOP", *[keys.bell(k) for k in self._poll_keys], timeout or 0]
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        try:
            self.client.connection.send_command(*args)
        except self.connection_errors:
            _mark_sweep()
            raise

    def _batch_size(self) -> int:
        """Messages to take now: one per free slot, times the prefetch multiplier while no gang holds slots here."""
        gate = self.qos.gate
        if gate is None:
            return 1
        ahead = gate.ahead()
        return max(1, gate.free()) * (ahead * self._burst if ahead > 1 else 1)

    def _take_args(self, queue_keys=None) -> list:
        """take.lua's arguments: this worker's queues and records, how many to take, and the results and acks
        it carries."""
        self._acks_sent, self._acks = self._acks, []
        self._results_sent, self._results = self._results, []
        if self._results_sent:
            self._results_at = monotonic()
        queue_keys = self._poll_keys if queue_keys is None else queue_keys
        want = self._batch_size() if queue_keys else 0
        result_keys, result_args = [], []
        for key, done, value, expires in self._results_sent:
            result_keys += [key, done]
            result_args += [value, expires]
        return [len(queue_keys) + 3 + len(result_keys), *queue_keys, self.unacked_key, self.unacked_index_key,
                keys.inflight(_consumer), *result_keys, want, time(), len(self._results_sent), *result_args,
                *self._acks_sent]

    def store_later(self, store: tuple) -> bool:
        """Store a job's result (``results.StoreLater.store``) with the next script this channel sends: on this
        turn of the event loop, or, within ``RESULTS_EVERY`` of the last results sent, with the others that
        come meanwhile (a take sent before then carries them too). False where this channel does not take
        (the caller stores it itself)."""
        if not self._taking() or self.closed or self._closing:
            return False
        self._results.append(store)
        if self._in_poll and self._poll_command == "BRPOP":  # waiting on a bell: no script goes before it rings
            self._flush_held()
        elif not self._results_due() and not self._results_timer_set:
            hub = get_event_loop()
            if hub is None:
                self._flush_held()
                return True
            self._results_timer_set = True

            def due():  # the loop wakes, and its next poll start sends them (QoS.can_consume)
                self._results_timer_set = False
            hub.call_later(max(self._results_at + self._results_every() - monotonic(), TURN_DELAY), due)
        return True

    def _results_due(self) -> bool:
        """Are results waiting, and is it time to send them without a take?"""
        return bool(self._results) and monotonic() - self._results_at >= self._results_every()

    def _results_every(self) -> float:
        """How long results wait for others to go with: longer while prefetched messages wait here, since the
        take that follows them carries the results (one script for several jobs, not one each)."""
        return RESULTS_EVERY_BUSY if self._buffer else RESULTS_EVERY

    def _brpop_read(self, **options):
        command, self._poll_command = self._poll_command, None
        if command is None:
            return super()._brpop_read(**options)
        try:
            try:
                reply = self.client.parse_response(self.client.connection, command, **options)
                if command == "BRPOP":  # a bell rang, or the wait timed out: take now either way
                    if not self.qos.may_deliver():  # shut meanwhile (a gang): take once it opens
                        self._taking_again = True
                        raise Empty()
                    with self.conn_or_acquire() as client:
                        reply = client.execute_command("EVAL", TAKE, *self._take_args())
            except self.connection_errors:
                _mark_sweep()  # the take may have happened with its reply lost: handed back after the reconnect
                self.client.connection.disconnect()
                raise
            finally:
                # Done, or (connection lost) handed back after the reconnect: the jobs run again, and store once.
                self._acks_sent, self._results_sent = [], []
            if self._poll_keys:  # (a script that only stored results took nothing)
                self._taking_again = len(reply) >= 2 * self._batch_size()
                if not self._taking_again:  # the queues ran dry: whatever comes next starts from the base
                    self._burst = 1
            if reply and not self._buffer:
                self._buffered_since = monotonic()
            for i in range(0, len(reply), 2):
                taken = self._taken(reply[i], reply[i + 1])
                if taken is not None:
                    self._buffer.append(taken)
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

    def _deliver_buffered(self) -> int:
        """Hand buffered messages to Celery while the gate lets one more start; how many were handed."""
        if self._buffer and (self._closing or not self._consumers):  # Celery stopped consuming (a warm shutdown)
            self._give_back()
        n = 0
        while self._buffer and self.qos.may_deliver():
            queue_key, _, message = self._buffer.popleft()
            dest = bytes_to_str(queue_key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            self.connection._deliver(message, dest)
            n += 1
        self._handed += n
        if n and not self._buffer:
            self._drained()
        if n:  # their acks may come a turn later
            self._turn_soon_if_acks_wait()
        return n

    def _drained(self) -> None:
        """The last buffered message started. A full take whose messages all started within ``BURST_DRAIN`` held
        tiny jobs, which otherwise wait on a round trip per take: the next take brings twice as many, up to
        ``BURST_MAX`` times the base; messages that took over twice as long, the base again (so a worker sits on
        more than about ``2 x BURST_DRAIN`` of work that an idle worker could have taken only for one take of a
        queue whose jobs turned long, until ``prefetch_hold`` hands them back). A take that finds its queues dry
        also starts the next from the base (``_brpop_read``)."""
        waited = monotonic() - self._buffered_since
        if waited <= BURST_DRAIN and self._taking_again:  # (a take that filled its batch: more were waiting)
            self._burst = min(self._burst * 2, BURST_MAX)
        elif waited > 2 * BURST_DRAIN:
            self._burst = 1

    def _turn_soon_if_acks_wait(self, delay: float = TURN_DELAY) -> None:
        """When only kombu's prefetch count holds the next message (or the next take) back, wake the loop soon.

        The acks it waits for are Celery's, sent on the event loop's next turn (``call_soon``). A job's ack is
        scheduled from the pool's result, after the loop's poll, so the next turn comes at once; but a message
        Celery drops on receipt (revoked) is acked from a delivery made on this turn, before the poll, and the
        poll then waits up to a second when nothing is in flight (no take is sent while messages wait). A timer
        due at once makes it return: without it, a worker went through a ``cancel``'s revoked messages two a
        second (a prefetch count of 2), and jobs sent after the cancel waited behind them. A turn that moves
        nothing looks again later, four times less often each time, up to a second.
        """
        gate = self.qos.gate
        if self._turn_timer_set or virtual.QoS.can_consume(self.qos) or (gate is not None and gate.free() <= 0):
            return
        hub = get_event_loop()
        if hub is None:
            return
        self._turn_timer_set = True
        handed = self._handed

        def turn():
            self._turn_timer_set = False
            if self.closed:  # kombu closed the channel meanwhile (a warm shutdown): close() gave the buffer back
                return
            self._deliver_buffered()
            self._turn_soon_if_acks_wait(TURN_DELAY if self._handed != handed else min(delay * 4, 1.0))
        hub.call_later(delay, turn)

    def _between_takes(self) -> None:
        """Each time kombu asks whether to consume: the buffer goes back when a gang holds slots here or it
        waited too long; acks that waited too long go alone."""
        gate = self.qos.gate
        if self._buffer and (gate is None or not gate.ahead() or monotonic() - self._buffered_since > gate.hold):
            self._give_back()
        if self._acks and monotonic() - self._acks_since > ACK_WAIT:
            self._flush_held()

    def _flush_held(self) -> None:
        """Send the results and acks this channel holds now, in a script of their own that takes nothing."""
        try:
            with self.conn_or_acquire() as client:
                client.execute_command("EVAL", TAKE, *self._take_args(queue_keys=[]))
        except self.connection_errors as err:  # again with the next take (an ack twice is once, a result too)
            log.warning("gpulayer: could not ack %d finished job(s) yet (%s)", len(self._acks_sent), err)
            self._acks = self._acks_sent + self._acks
            self._results = self._results_sent + self._results
        finally:
            self._acks_sent, self._results_sent = [], []

    def _give_back(self) -> None:
        """Requeue the buffered messages at the head of their queues, as taken, in one script (give_back.lua)."""
        if not self._buffer:
            return
        self._burst = 1  # (a gang, a stop, or jobs slower than prefetch_hold)
        items, self._buffer = list(self._buffer), deque()
        args = []
        for _, item, message in items:
            tag = message["properties"]["delivery_tag"]
            self._recorded.pop(tag, None)
            args += [tag, item]
        queue_keys = [queue_key for queue_key, _, _ in items]
        try:
            with self.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
                pipe.eval(GIVE_BACK, 3 + len(items), self.unacked_key, self.unacked_index_key,
                          keys.inflight(_consumer), *queue_keys, *args)
                for queue_key in set(queue_keys):
                    ring(pipe, queue_key)
                pipe.execute()
        except self.connection_errors as err:  # still recorded as ours: handed back after the reconnect
            _mark_sweep()
            log.warning("gpulayer: could not give back %d prefetched message(s) (%s)", len(items), err)

    def close(self):
        """Before kombu closes the channel: read a take still in flight, give back what was never started, and
        send the acks that wait."""
        if self._taking() and not self.closed:
            self._closing = True  # nothing more is handed to Celery
            try:
                if self._in_poll:
                    try:
                        self._brpop_read()
                    except Empty:
                        pass
                self._give_back()
                if self._acks or self._results:
                    self._flush_held()
            except self.connection_errors as err:
                log.warning("gpulayer: closing the channel without reaching Redis (%s)", err)
        super().close()

    def _recover_after_reconnect(self) -> None:
        global _recheck
        with self.conn_or_acquire() as client:
            self._hand_back_dropped(client)
        _recheck = False

    def _hand_back_dropped(self, client) -> None:
        """Requeue what this life recorded but holds no longer.

        Celery drops the requests it had taken but not started when its broker connection breaks,
        counting on the broker to deliver them again (for Redis: after the visibility timeout); the
        old channel's prefetched messages and unsent acks went with it too (a finished job's message
        comes back, and is ignored as done), and so did a take whose reply was lost.
        """
        from .qos import held_requests  # the worker's own requests; this runs in its consumer

        held = {getattr(getattr(r, "_message", None), "delivery_tag", None) for r in held_requests()}
        held.update(m["properties"]["delivery_tag"] for _, _, m in self._buffer)
        held.update(self._acks)
        for raw in client.hkeys(keys.inflight(_consumer)):
            tag = bytes_to_str(raw)
            if tag not in held and client.hdel(keys.inflight(_consumer), tag):
                self.qos.restore_by_tag(tag, client)
                log.warning("gpulayer: requeued message %s, dropped by the worker when Redis went away", tag)


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
