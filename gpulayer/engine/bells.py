"""Bells: how an idle worker learns that a message came, since a take (a Lua script) cannot block.

Every publish through gpulayer's transport pushes a token on its queue's bell (a list per queue,
``keys.bell``, capped at ``BELL_TOKENS``); an idle worker blocks on its queues' bells and takes when
one rings, or after ``brpop_timeout`` (1 s) anyway, which covers messages put back by anything that
does not ring (engine/transport.py).
"""

from __future__ import annotations

from kombu.transport import redis as kredis
from kombu.utils.encoding import bytes_to_str

from ..store import keys

BELL_TOKENS = 64  # tokens kept per bell: enough to wake every idle worker of a queue at once


def ring(pipe, queue_key) -> None:
    """Add a wake-up token for ``queue_key``'s idle takers to ``pipe`` (a pipeline or a publish batch)."""
    add = pipe.add if isinstance(pipe, kredis.PublishBatch) else (lambda name, *a: getattr(pipe, name)(*a))
    add("lpush", keys.bell(bytes_to_str(queue_key)), 1)
    add("ltrim", keys.bell(bytes_to_str(queue_key)), 0, BELL_TOKENS - 1)
