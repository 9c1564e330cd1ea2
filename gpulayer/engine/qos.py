"""The consumer's "may I take a message?": the worker's slot gate, as the transport's QoS asks it.

The gang agent's slot gate (gang/agent.py ``SlotGate``) lets a message start only while a slot
is free for it, and lets the worker take messages ahead of its free slots only while no gang
holds slots on it. kombu asks the channel's QoS before every take (``can_consume``, overridden
in engine/transport.py, pinned in engine/upstream.py); the gate is set on that one instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


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
