"""Deliveries kombu's Redis transport holds unacknowledged: ask about one, give it back, or drop it.

kombu keeps each delivered message, until its ack, in the ``unacked`` hash (delivery tag ->
``[message, exchange, routing key]``, engine/envelope.py) and the ``unacked_index`` sorted set (tag ->
when it was delivered); the transport's take writes both in the step that takes the message
(store/lua/take.lua). The janitor hands a dead worker's deliveries back through :class:`Unacked`, the
emulator acks with :func:`forget`. The key names and kombu's ``QoS.restore_by_tag`` are pinned in
engine/upstream.py.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from kombu.transport import redis as kredis

from ..store import fair
from . import envelope

UNACKED = kredis.Channel.unacked_key  # kombu's default key names (a channel's transport options may rename them)
UNACKED_INDEX = kredis.Channel.unacked_index_key


def forget(pipe, tag: str, unacked: str = UNACKED, index: str = UNACKED_INDEX) -> None:
    """Add to ``pipe`` the removal of ``tag``'s unacked entry and index: acked, or given up for good."""
    pipe.zrem(index, tag)
    pipe.hdel(unacked, tag)


class Unacked:
    """The unacked deliveries as one broker channel of the app keeps them: its key names and its restore."""

    def __init__(self, channel):
        self.channel = channel
        self.key, self.index_key = channel.unacked_key, channel.unacked_index_key

    def holds(self, client, tag: str) -> bool:
        """Is ``tag`` still delivered and not acknowledged?"""
        return bool(client.hexists(self.key, tag))

    def older_than(self, client, when: float) -> list[str]:
        """Tags delivered before ``when`` (a Unix time) and still unacknowledged."""
        return [raw.decode() for raw in client.zrangebyscore(self.index_key, "-inf", when)]

    def message(self, client, tag: str) -> dict | None:
        """The message delivered as ``tag``; None once it is acknowledged or given back, {} when unreadable."""
        entry = client.hget(self.key, tag)
        if entry is None:
            return None
        try:
            message = envelope.of_unacked(entry)
        except (ValueError, IndexError, TypeError):
            return {}
        return message if isinstance(message, dict) else {}

    def give_back(self, tag: str) -> None:
        """Requeue ``tag``'s message at the consuming end of its queue (next in line), as kombu restores one."""
        self.channel.qos.restore_by_tag(tag)

    def drop(self, client, tag: str) -> None:
        """Remove ``tag``'s delivery without requeueing it (its job failed for good)."""
        pipe = client.pipeline()
        forget(pipe, tag, self.key, self.index_key)
        fair.release(pipe, [tag], charge=True)  # its user's slot back (store/fair.py)
        pipe.execute()


@contextmanager
def unacked(app) -> Iterator[Unacked]:
    """The unacked deliveries of ``app``'s broker, through a channel of a connection from its pool."""
    with app.connection_for_write() as conn:
        yield Unacked(conn.default_channel)
