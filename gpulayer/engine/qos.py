"""The consumer's "may I take a message?": the worker's slot gate, and what the worker runs and holds.

The gang agent's slot gate (gang/agent.py ``SlotGate``) lets a message start only while a slot
is free for it, and lets the worker take messages ahead of its free slots only while no gang
holds slots on it. kombu asks the channel's QoS before every take (``can_consume``): :class:`QoS`, the
QoS of gpulayer's transport (engine/transport.py), which also defers the worker's acks to its next take
(kombu's ``append``, ``ack``, ``can_consume`` overridden, pinned in engine/upstream.py). The gate is set on
one instance, the task consumer's channel's QoS (Celery's ``Tasks`` consumer step creates the task consumer).

The requests the worker runs and holds are Celery's worker state (``celery.worker.state``: its
``task_reserved``, ``task_accepted`` and ``task_ready`` keep the sets read here, pinned in
engine/upstream.py); the slot gate, the gang agent and the reaper read them through these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from celery.worker import state as worker_state
from kombu.transport import redis as kredis
from kombu.transport import virtual

from ..store import fair
from .batches import extra_active, extra_reserved


@dataclass(frozen=True)
class Gate:
    free: Callable[[], int]  # slots free for one more ordinary job now (slots - taken jobs - gang-held slots)
    ahead: Callable[[], int]  # messages per free slot a take may bring; 0 while a gang holds slots here
    hold: float  # seconds the extra ones may wait on the worker before they go back to their queue


class QoS(kredis.QoS):
    """kombu's Redis QoS, with acks that ride on the next take and the worker's slot gate.

    ``gate`` (:func:`gate_consumption`) is set on the consuming channel's QoS of a worker: kombu asks
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
        channel._carry.ack(delivery_tag)
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
        return channel._poll_command == "EVAL" or channel._results_due() or self.may_deliver() or channel._refill()

    def may_deliver(self) -> bool:
        """May the worker start one more message now (its slot gate, then kombu's prefetch count)?"""
        gate = self.gate
        return (gate is None or gate.free() > 0) and self.under_prefetch_count()

    def under_prefetch_count(self) -> bool:
        """kombu's prefetch count (its ``can_consume``), with a batch's messages counted once
        (engine/batches.py: several jobs to one pool process)."""
        count = self.prefetch_count
        return not count or len(self._delivered) - len(self._dirty) - extra_reserved() < count

    def _remove_from_indices(self, delivery_tag, pipe=None):
        pipe = super()._remove_from_indices(delivery_tag, pipe)
        records = self.channel._records_key()
        if records is not None:
            pipe.hdel(records, delivery_tag)
        fair.release(pipe, [delivery_tag], charge=True)  # acked or requeued: its user's slot back (store/fair.py)
        return pipe


def gate_consumption(qos, free: Callable[[], int], ahead: Callable[[], int] = lambda: 0, hold: float = 0.0) -> None:
    """Make ``qos`` (the consuming channel's QoS) start a message only while ``free() > 0``, and take up
    to ``free() * ahead()`` messages at once; the extra ones wait in the channel, and go back to their
    queue once ``ahead()`` is 0 or after ``hold`` seconds."""
    qos.gate = Gate(free, ahead, hold)


def gate_consumer(consumer, free: Callable[[], int], ahead: Callable[[], int] = lambda: 0, hold: float = 0.0) -> None:
    """:func:`gate_consumption` for Celery's worker consumer ``consumer`` (what a consumer bootstep's ``start``
    is given, once its task consumer exists): the gate goes on its task consumer's channel's QoS."""
    gate_consumption(consumer.task_consumer.channel.qos, free, ahead, hold)


def running() -> list:
    """Celery's requests this worker is running now (each one's ``id``, ``worker_pid``, ``time_start``...)."""
    return list(worker_state.active_requests)


def running_count() -> int:
    """How many slots this worker's pool runs jobs in now (a batch of tiny jobs in one process counts once)."""
    return max(0, len(worker_state.active_requests) - extra_active())


def reserved_count() -> int:
    """How many slots the jobs this worker took and has not finished hold (running ones included; a batch of
    tiny jobs for one process counts once)."""
    return max(0, len(worker_state.reserved_requests) - extra_reserved())


def held_requests() -> list:
    """Every request this worker holds: running, or taken and waiting for a slot."""
    return [*worker_state.active_requests, *worker_state.reserved_requests]
