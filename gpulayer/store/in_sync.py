"""How many replicas of the primary are in sync now: connected, ``online``, and acknowledging (INFO replication).

``durability = "replicated"`` waits for these (store/durability.py): a write waits for one of them, and when
there is none (the group lost its only replica, or a failover promoted it and the old primary is gone) writes go
on, acknowledged by the primary alone, until one is back. A replica counts while its last acknowledgement is
at most ``replication.MAX_LAG`` seconds old (replicas acknowledge every second; Redis's ``min-replicas-max-lag`` default):
a frozen replica still looks connected, and is waited for (and misses) until then.

The count is read once per ``CACHE_SECONDS`` per process and connection pool, so a write costs no extra round
trip; :func:`forget` drops it (a connection lost: the next write may reach another primary), and
:func:`forget_all` every one (the sentinels announced a switch), so the first write to a new primary does not
wait for a replica the old one had.
"""

from __future__ import annotations

import os
import threading
from time import monotonic

import redis

from .replication import in_sync_count as count

CACHE_SECONDS = 1.0

_cache: dict[tuple[int, int], tuple[float, int]] = {}  # (pid, id of the pool) -> (read at, replicas in sync)
_lock = threading.Lock()


def _key(client: redis.Redis) -> tuple[int, int]:
    return os.getpid(), id(client.connection_pool)


def in_sync(client: redis.Redis, fresh: bool = False) -> int | None:
    """Replicas in sync with the primary ``client`` reaches (cached ``CACHE_SECONDS``; ``fresh``: read now);
    None when it could not be read (the primary is going away: the write's own error says more)."""
    key = _key(client)
    now = monotonic()
    if not fresh:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
    try:
        info = client.info("replication")
    except redis.RedisError:
        forget(client)
        return None
    if info.get("role") != "master":  # a demoted primary: the write is refused and sent to the new one
        forget(client)
        return None
    n = count(info)
    with _lock:
        _cache[key] = (now, n)
    return n


def forget(client: redis.Redis) -> None:
    """Read the count again at the next write (``client``'s connection was lost: it may reach a new primary)."""
    with _lock:
        _cache.pop(_key(client), None)


def forget_all() -> None:
    """Read every count again at the next write (the group switched primaries: engine/sentinel.py's watch)."""
    with _lock:
        _cache.clear()
