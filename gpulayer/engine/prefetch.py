"""Messages a worker takes ahead of its free slots: they wait on the worker, recorded, and go back when needed.

While no gang holds slots on the worker, a take brings up to free slots x ``prefetch_multiplier``
messages (up to ``BURST_MAX`` times that while full takes start all their messages within
``BURST_DRAIN``: tiny jobs); the ones beyond the free slots wait in the channel, recorded, and go to
Celery one by one as slots free up (the slot gate, engine/qos.py, decides). When a gang reserves slots
here, the waiting ones go back to the head of their queues, as taken, in one script
(``store/lua/give_back.lua``), before the gate lets anything else start; so do they when the worker
stops, and when they waited longer than ``prefetch_hold``. While a full batch of tiny jobs runs in a pool
process (engine/batches.py), the worker also takes with no slot free, until a batch's worth waits
(:meth:`Prefetch._refill`): the next batch is on hand when the slot frees.

:class:`Prefetch` is mixed into the transport's ``Channel`` (engine/transport.py), which provides the
take itself, ``_records_key()`` (this worker life's delivery records) and ``_sweep_later()``.
"""

from __future__ import annotations

import logging
from collections import deque
from importlib import resources
from time import monotonic

from kombu.asynchronous import get_event_loop
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str

from ..store import fair, keys
from . import envelope
from .batches import batchable, batches
from .bells import ring
from .loop import TURN_DELAY

log = logging.getLogger(__name__)

BURST_MAX = 4  # a take brings up to this many times free slots x prefetch_multiplier while jobs are tiny
BURST_DRAIN = 0.05  # seconds: a full take whose messages all started within this long doubles the next (to
# BURST_MAX); one whose messages took over twice as long, or a take that found its queues dry, takes the base again
GIVE_BACK = resources.files("gpulayer.store").joinpath("lua", "give_back.lua").read_text()


class Prefetch:
    """The channel's buffer of taken, recorded messages not yet handed to Celery, and the size of its takes."""

    def _init_prefetch(self) -> None:
        self._buffer: deque[tuple[bytes, bytes, dict]] = deque()  # taken and recorded, not yet delivered
        self._buffered_since = 0.0
        self._burst = 1  # the next take's size over free slots x prefetch_multiplier (_drained)
        self._taking_again = False  # the last take filled its batch: take again without waiting
        self._turn_timer_set = False  # _turn_soon_if_acks_wait's timer is set
        self._handed = 0  # messages handed to Celery by _deliver_buffered, ever

    def _batch_size(self) -> int:
        """Messages to take now: one per free slot, times the prefetch multiplier while no gang holds slots here."""
        gate = self.qos.gate
        if gate is None:
            return 1
        if self._fair.on:  # each take fills free slots from the best-ranked user's list (store/fair.py)
            return max(1, gate.free())
        ahead = gate.ahead()
        return max(1, gate.free()) * (ahead * self._burst if ahead > 1 else 1)

    def _refill(self) -> bool:
        """Take more although no slot is free? While a full batch of tiny jobs runs (engine/batches.py: a backlog)
        and no gang holds slots here, once less than a batch waits: the next batch is here when a slot frees,
        instead of a take's round trip later (and as small as what was left). So the worker holds at most one
        batch more than without it, given back after ``prefetch_hold`` if the jobs turned slow."""
        gate = self.qos.gate
        return (batches.full_in_flight > 0 and gate is not None and not self._fair.on and len(self._buffer) < batches.size
                and not self._closing and gate.ahead() > 0)

    def _buffer_taken(self, taken: list[tuple[bytes, bytes, dict]]) -> None:
        """A take's messages wait here until the gate lets each start."""
        if taken and not self._buffer:
            self._buffered_since = monotonic()
        self._buffer.extend(taken)

    def _deliver_buffered(self) -> int:
        """Hand buffered messages to Celery while the gate lets one more start; how many were handed."""
        if self._buffer and (self._closing or not self._consumers):  # Celery stopped consuming (a warm shutdown)
            self._give_back()
        n = 0
        while self._buffer and self.qos.may_deliver():
            # Under a backlog, several tiny jobs for one free slot, to one pool process at once (engine/batches.py).
            gate = self.qos.gate
            size = batches.group_size(len(self._buffer), gate.free() if gate is not None else 1)
            if size == 0 or not batchable(self._buffer[0][2]):
                self._deliver_next()
                n += 1
                continue
            with batches.collecting():
                self._deliver_next()
                n += 1
                for _ in range(size - 1):
                    if not self._buffer or not batchable(self._buffer[0][2]):
                        break
                    self._deliver_next()
                    n += 1
        self._handed += n
        if n and not self._buffer:
            self._drained()
        if n:  # their acks may come a turn later
            self._turn_soon_if_acks_wait()
        return n

    def _deliver_next(self) -> None:
        queue_key, _, message = self._buffer.popleft()
        dest = keys.base_queue(bytes_to_str(queue_key)).rsplit(self.sep, 1)[0]  # (a user's list: its queue's)
        self._queue_cycle.rotate(dest)
        self.connection._deliver(message, dest)

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
        if self._turn_timer_set or self.qos.under_prefetch_count() or (gate is not None and gate.free() <= 0):
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

    def _give_back_if_unwanted(self) -> None:
        """Each time kombu asks whether to consume: the buffer goes back when a gang holds slots here or it
        waited too long."""
        gate = self.qos.gate
        if self._buffer and (gate is None or not gate.ahead() or monotonic() - self._buffered_since > gate.hold):
            self._give_back()

    def _give_back(self) -> None:
        """Requeue the buffered messages at the head of their queues, as taken, in one script (give_back.lua)."""
        if not self._buffer:
            return
        self._burst = 1  # (a gang, a stop, or jobs slower than prefetch_hold)
        items, self._buffer = list(self._buffer), deque()
        args = []
        for _, item, message in items:
            tag = envelope.delivery_tag(message)
            self._recorded.pop(tag, None)
            args += [tag, item]
        queue_keys = [queue_key for queue_key, _, _ in items]
        try:
            with self.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
                pipe.eval(GIVE_BACK, 3 + len(items), self.unacked_key, self.unacked_index_key,
                          self._records_key(), *queue_keys, *args)
                fair.release(pipe, [tag for tag in args[0::2]], charge=False)  # never started: not charged
                for queue_key in set(queue_keys):
                    ring(pipe, keys.base_queue(bytes_to_str(queue_key)))
                pipe.execute()
        except self.connection_errors as err:  # still recorded as ours: handed back after the reconnect
            self._sweep_later()
            log.warning("gpulayer: could not give back %d prefetched message(s) (%s)", len(items), err)

    def _buffered_tags(self) -> list[str]:
        return [envelope.delivery_tag(message) for _, _, message in self._buffer]
