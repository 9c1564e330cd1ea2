"""After kombu reconnects: what this worker life recorded but holds no longer goes back to its queue.

Celery drops the requests it had taken but not started when its broker connection breaks, counting
on the broker to deliver them again (for Redis: after the visibility timeout); the old channel's
prefetched messages and unsent acks went with it too (a finished job's message comes back, and is
ignored as done), and so did a take whose reply was lost. So before its next take, the worker's
channel looks for what this life recorded (``keys.inflight``) but holds no longer, and requeues it:
after a round trip that failed (:func:`recheck_later`), and when a new channel takes over from
another. Not for other channels of the process (the janitor's, publishers').
"""

from __future__ import annotations

import logging
import weakref
from typing import Callable, Iterable

from kombu.utils.encoding import bytes_to_str

from .qos import held_requests

log = logging.getLogger(__name__)

_recheck = False
_taker: weakref.ref | None = None  # the channel that took last


def recheck_later() -> None:
    """A round trip failed (its take may have happened with the reply lost): look again before the next take."""
    global _recheck
    _recheck = True


def must_recheck(channel) -> bool:
    """Before ``channel`` takes: must it look for what this life dropped (kombu reconnected, or a round trip
    failed)?"""
    global _taker
    if _taker is None or _taker() is not channel:
        if _taker is not None:
            recheck_later()  # a new channel takes over: kombu reconnected
        _taker = weakref.ref(channel)
    return _recheck


def hand_back_dropped(client, records_key: str, holding: Iterable[str], restore: Callable) -> None:
    """Requeue (``restore(tag, client)``: kombu's ``QoS.restore_by_tag``) each delivery recorded under
    ``records_key`` that neither Celery's requests nor ``holding`` (the channel's own: buffered, acks unsent)
    hold."""
    global _recheck
    held = {getattr(getattr(r, "_message", None), "delivery_tag", None)  # the worker's own requests
            for r in held_requests()}
    held.update(holding)
    for raw in client.hkeys(records_key):
        tag = bytes_to_str(raw)
        if tag not in held and client.hdel(records_key, tag):
            restore(tag, client)
            log.warning("gpulayer: requeued message %s, dropped by the worker when Redis went away", tag)
    _recheck = False
