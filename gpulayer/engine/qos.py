"""The consumer's "may I take a message?": kombu's ``QoS.can_consume``, with a condition of ours first.

The gang agent's slot gate (gang/agent.py ``SlotGate``) takes a message only while a slot is
free for it; kombu asks the channel's QoS before every take, so the gate wraps that one
instance's ``can_consume`` (kombu 5.7, pinned in engine/upstream.py).
"""

from __future__ import annotations

from types import MethodType
from typing import Callable

from .upstream import patch


def gate_consumption(qos, may_take: Callable[[], bool]) -> None:
    """Make ``qos`` (a channel's QoS) consume only while ``may_take()`` and kombu's own check agree."""
    original = qos.can_consume

    def can_consume(self):
        return may_take() and original()

    patch(qos, "kombu.transport.virtual.base:QoS.can_consume", MethodType(can_consume, qos))
