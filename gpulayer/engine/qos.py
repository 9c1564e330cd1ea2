"""The consumer's "may I take a message?": the worker's slot gate, and what the worker runs and holds.

The gang agent's slot gate (gang/agent.py ``SlotGate``) lets a message start only while a slot
is free for it, and lets the worker take messages ahead of its free slots only while no gang
holds slots on it. kombu asks the channel's QoS before every take (``can_consume``, overridden
in engine/transport.py, pinned in engine/upstream.py); the gate is set on that one instance, the
task consumer's channel's QoS (Celery's ``Tasks`` consumer step creates the task consumer).

The requests the worker runs and holds are Celery's worker state (``celery.worker.state``: its
``task_reserved``, ``task_accepted`` and ``task_ready`` keep the sets read here, pinned in
engine/upstream.py); the slot gate, the gang agent and the reaper read them through these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from celery.worker import state as worker_state


@dataclass(frozen=True)
class Gate:
    free: Callable[[], int]  # slots free for one more ordinary job now (slots - taken jobs - gang-held slots)
    ahead: Callable[[], int]  # messages per free slot a take may bring; 0 while a gang holds slots here
    hold: float  # seconds the extra ones may wait on the worker before they go back to their queue


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
    """How many jobs this worker's pool runs now."""
    return len(worker_state.active_requests)


def reserved_count() -> int:
    """How many jobs this worker took and has not finished (running ones included)."""
    return len(worker_state.reserved_requests)


def held_requests() -> list:
    """Every request this worker holds: running, or taken and waiting for a slot."""
    return [*worker_state.active_requests, *worker_state.reserved_requests]
