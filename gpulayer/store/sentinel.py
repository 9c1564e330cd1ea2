"""Connections to a Sentinel group's primary: asked of the sentinels at every connect, found again after a failover.

``store/connection.py`` builds every client of a ``sentinel://`` broker with :func:`sentinel_pool`, and the
engine's kombu channel and result backend build their pools with it too, so one mechanism serves them all.

redis-py's ``SentinelConnectionPool`` asks the sentinels for the primary's address each time one of its
connections connects. A connection to a server that is no longer the primary is dropped and connected again:
one refused (the old primary is down) fails like any lost connection, and a write refused with ``READONLY``
(the old primary came back as a replica) is turned into a ``ConnectionError`` by redis-py's
``SentinelManagedConnection``; redis-py's client retries a failed command on a new connection (three times,
with backoff), which asks the sentinels again, and every caller that already rides out a lost broker
(``store/broker_loss.py``) rides out a failover the same way. No process restarts.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from ..sentinel_url import SentinelTarget, parse_sentinel_url



class PrimaryMoved(redis.ConnectionError):
    """A write was refused with ``READONLY``: the server this connection reached is a replica now. The command
    did not run, so it is sent again, on a new connection to the primary the sentinels name."""


# A command refused with READONLY is sent again (each try connects anew, asking the sentinels); nothing else
# is retried here: a command whose connection broke may have run, and its caller decides.
RETRY_MOVED = Retry(NoBackoff(), 3, supported_errors=(PrimaryMoved,))

# Short: a sentinel that does not answer within this is skipped for the next one (they are asked in turn).
SENTINEL_TIMEOUT = 2.0

_managers: dict[tuple, Sentinel] = {}
_managers_lock = threading.Lock()
_tls_classes: dict[type, type] = {}
# The connection class of Sentinel clients: redis-py's, until engine/sentinel.py (imported with the Celery app)
# installs its own, whose connect waits out a failover (store/ never imports engine/).
_managed: type[redis.Connection] = SentinelManagedConnection


# Called with (target, pool) for each pool built: engine/sentinel.py watches the group's switches with it.
_on_pool: Callable[[SentinelTarget, SentinelConnectionPool], None] | None = None


def watch_pools(on_pool: Callable[[SentinelTarget, SentinelConnectionPool], None]) -> None:
    """Call ``on_pool(target, pool)`` for every Sentinel pool built from now on."""
    global _on_pool
    _on_pool = on_pool


def use_for_sentinel(connection_class: type[redis.Connection]) -> None:
    """Make every Sentinel pool built from now on use ``connection_class`` (a ``SentinelManagedConnection``)."""
    global _managed
    _managed = connection_class
    _tls_classes.clear()


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A Sentinel pool whose threads wait for a free connection (``connect_redis(..., one_connection=True)``)."""


def manager(target: SentinelTarget) -> Sentinel:
    """This process's ``redis.sentinel.Sentinel`` for ``target``'s sentinels (one per group and process)."""
    key = (target.key(), os.getpid())
    with _managers_lock:
        found = _managers.get(key)
        if found is None:
            kwargs = {"socket_connect_timeout": SENTINEL_TIMEOUT, "socket_timeout": SENTINEL_TIMEOUT,
                      "password": target.sentinel_password}
            if target.tls:
                kwargs.update(ssl=True, **target.tls_options)
            found = _managers[key] = Sentinel(list(target.sentinels), sentinel_kwargs=kwargs)
    return found


def managed_connection_class(tls_connection: type[redis.Connection] | None) -> type[redis.Connection]:
    """The connection class that asks the sentinels where the primary is: redis-py's, or over TLS its
    ``SentinelManagedConnection`` in front of ``tls_connection`` (gpulayer's one-context TLS connection)."""
    if tls_connection is None:
        return _managed
    if tls_connection not in _tls_classes:
        _tls_classes[tls_connection] = type("SentinelManagedTLSConnection", (_managed, tls_connection), {})
    return _tls_classes[tls_connection]


def sentinel_pool(url: str | SentinelTarget, *, tls_connection: type[redis.Connection] | None = None,
                  blocking: bool = False, **kwargs) -> SentinelConnectionPool:
    """A pool of connections to the primary of the group ``url`` names; ``kwargs``: connection options
    (``socket_timeout``, ``client_name``, a ``connection_class`` that derives from
    :func:`managed_connection_class`, ...). ``host`` and ``port`` are ignored: the sentinels say them."""
    target = url if isinstance(url, SentinelTarget) else parse_sentinel_url(url)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("host", "port")}
    kwargs.setdefault("connection_class", managed_connection_class(tls_connection if target.tls else None))
    if target.tls:
        for option, value in target.tls_options.items():
            kwargs.setdefault(option, value)
    kwargs.setdefault("retry", RETRY_MOVED)
    kwargs.setdefault("db", target.db)
    if target.password:
        kwargs.setdefault("password", target.password)
    if target.username:
        kwargs.setdefault("username", target.username)
    if blocking:
        kwargs.setdefault("max_connections", 1)
    pool_class = BlockingSentinelPool if blocking else SentinelConnectionPool
    pool = pool_class(target.service, manager(target), **kwargs)
    if _on_pool is not None:
        _on_pool(target, pool)
    return pool


def primary_address(url: str | SentinelTarget) -> tuple[str, int]:
    """Where the sentinels say the group's primary is now (``MasterNotFoundError`` when none of them knows)."""
    target = url if isinstance(url, SentinelTarget) else parse_sentinel_url(url)
    return manager(target).discover_master(target.service)
