"""How many replicas of the primary are in sync now: connected, ``online``, and acknowledging (INFO replication).

``durability = "replicated"`` waits for these (store/durability.py): a write waits for one of them, and when
there is none (the group lost its only replica, or a failover promoted it and the old primary is gone) writes go
on, acknowledged by the primary alone, until one is back. A replica counts while its last acknowledgement is
at most ``replication.MAX_LAG`` seconds old (replicas acknowledge every second; Redis's ``min-replicas-max-lag`` default):
a frozen replica still looks connected, and is waited for (and misses) until then.

Right after a failover the new primary has no replica yet, while the sentinels point the group's other
replicas at it: a write then still waits for one (:func:`coming`, asked of the sentinels, up to
``COMING_GRACE`` seconds), so only a group with no live replica left goes on degraded at once.

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
# Seconds a write keeps waiting for a replica the sentinels see coming (a failover points the group's other
# replicas at the new primary one after the other, in about a second), before it goes on degraded all the same.
COMING_GRACE = 10.0

_cache: dict[tuple[int, int], tuple[float, int]] = {}  # (pid, id of the pool) -> (read at, replicas in sync)
_coming: dict[tuple[int, int], tuple[float, bool]] = {}  # the same -> (read at, a replica is coming)
_none_since: dict[tuple[int, int], float] = {}  # the same -> since when no replica is in sync
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
        if n:
            _none_since.pop(key, None)
    return n


def coming(client: redis.Redis) -> bool:
    """While no replica is in sync: do the group's sentinels see one up and linked, other than this primary, that
    will be (a failover just pointed it here)? For up to ``COMING_GRACE`` seconds of no replica in sync, read at
    most once per ``CACHE_SECONDS``; False for a primary that is not a Sentinel group's (nothing to ask)."""
    pool = client.connection_pool
    manager, service = getattr(pool, "sentinel_manager", None), getattr(pool, "service_name", None)
    if manager is None or service is None:
        return False
    key = _key(client)
    now = monotonic()
    with _lock:
        since = _none_since.setdefault(key, now)
        hit = _coming.get(key)
    if now - since >= COMING_GRACE:
        return False
    if hit is not None and now - hit[0] < CACHE_SECONDS:
        return hit[1]
    try:
        run_id = client.info("server").get("run_id")
    except redis.RedisError:
        return False
    found = _linked_replica(manager, service, run_id)
    with _lock:
        _coming[key] = (now, found)
    return found


def _linked_replica(manager, service: str, run_id: str | None) -> bool:
    """Does a sentinel of ``manager`` know a replica of ``service`` neither down nor unreachable, other than the
    primary (``run_id``; a sentinel that has not yet heard of the switch still lists the promoted replica)?"""
    for sentinel in manager.sentinels:
        try:
            replicas = sentinel.sentinel_slaves(service)
        except redis.RedisError:
            continue  # the next sentinel
        return any(not (r.get("is_sdown") or r.get("is_odown") or r.get("is_disconnected"))
                   and r.get("runid") != run_id for r in replicas)
    return False


def forget(client: redis.Redis) -> None:
    """Read the count again at the next write (``client``'s connection was lost: it may reach a new primary)."""
    with _lock:
        _cache.pop(_key(client), None)
        _coming.pop(_key(client), None)


def forget_all() -> None:
    """Read every count again at the next write (the group switched primaries: engine/sentinel.py's watch)."""
    with _lock:
        _cache.clear()
        _coming.clear()
