"""kombu's transport and Celery's result backend on a Sentinel group, through gpulayer's own connections.

kombu cannot read gpulayer's ``sentinel://h1:p1,h2:p2/<group>/<db>`` (its URLs have one host; its own
sentinel transport takes ``sentinel://h1:p1;sentinel://h2:p2`` and the group as a transport option, and
lacks the takes a SIGKILL cannot lose). So for a Sentinel broker :func:`engine_url` gives kombu and Celery a
``redis://`` URL naming the group in place of a host, with the Sentinel URL itself in the transport options
(``SENTINEL_OPTION``); the channel (engine/transport.py) and the result backend (engine/results.py) then
build their connection pools with ``store.sentinel.sentinel_pool`` instead of redis-py's ``ConnectionPool``:
they override kombu 5.7's ``Channel._get_pool`` and Celery 5.7's ``RedisBackend._get_pool`` (pinned in
engine/upstream.py). Every connection asks the sentinels where the primary is when it connects, and a
connection lost in a failover (or refused with ``READONLY`` by a demoted primary) is connected again by
kombu's and Celery's own reconnects, to the new primary.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from urllib.parse import quote

import redis
from redis.sentinel import SentinelManagedConnection

from ..deadline import Deadline
from ..sentinel_url import SentinelTarget, is_sentinel_url, parse_sentinel_url
from ..store.in_sync import forget_all
from ..store.sentinel import PrimaryMoved, managed_connection_class, sentinel_pool, use_for_sentinel, watch_pools
from .redis_tls import TLSConnection

log = logging.getLogger(__name__)
SENTINEL_OPTION = "gpulayer_sentinel"  # broker_transport_options key: the Sentinel URL the pools connect through
# Seconds a new connection waits for the group to have a primary again: the sentinels' down-after-milliseconds
# plus their election, with room (gpulayer up's group: 2 s + about 1 s; Sentinel's default: 30 s + about 1 s).
FAILOVER_WAIT = 40.0
RETRY_EVERY = 0.2


class FailoverConnection(SentinelManagedConnection):
    """redis-py's connection to a Sentinel group's primary, whose connect waits out a failover.

    redis-py's asks the sentinels once and fails when the primary they name refuses (it was just killed, and
    they have not noticed yet) or none is named (the election runs): here it asks again every ``RETRY_EVERY``
    for up to ``FAILOVER_WAIT`` seconds, so a command sent in a failover is delayed, not refused. A wrong
    password fails at once. Only the connect waits: a command whose connection breaks mid-way still fails (it
    may have run), for its caller to decide (kombu reconnects, a take is handed back, a waiter rides it out).

    A write refused with ``READONLY`` (the server was demoted: a failover, or an old primary back as a
    replica) raises :class:`~gpulayer.store.sentinel.PrimaryMoved` after redis-py's ``read_response`` dropped
    the connection; the clients of ``store.sentinel.sentinel_pool`` send such a command again, to the primary.

    Overrides redis-py 8.1's ``SentinelManagedConnection.connect`` and ``read_response``, and
    ``Connection.send_packed_command``, whose reconnect would skip the sentinels (pinned in engine/upstream.py).
    """

    def send_packed_command(self, command, check_health=True):
        # redis-py reconnects a dropped connection here to the address it had (a command sent again after a
        # READONLY would go back to the replica): connect as the sentinels say instead.
        if not self._sock:
            self.connect()
        return super().send_packed_command(command, check_health)

    def read_response(self, *args, **kwargs):
        try:
            return super().read_response(*args, **kwargs)
        except redis.ConnectionError as err:
            if type(err) is redis.ConnectionError and str(err) == "The previous master is now a slave":
                raise PrimaryMoved(f"{self.host}:{self.port} is a replica now (READONLY); asking the sentinels "
                                   "for the primary") from err
            raise

    def connect(self):
        deadline = Deadline(FAILOVER_WAIT)
        while True:
            try:
                return super().connect()
            except redis.AuthenticationError:
                raise
            except (redis.ConnectionError, redis.TimeoutError):
                if deadline.expired():
                    raise
                time.sleep(deadline.left(RETRY_EVERY))


use_for_sentinel(FailoverConnection)


class SwitchWatch(threading.Thread):
    """Listens to the group's sentinels for ``+switch-master`` and cuts this process's connections to the old
    primary at once (one thread per group and process, started with the first pool).

    A killed primary's connections fail by themselves; a frozen one's (SIGSTOP, a machine that hangs, a cut
    network) would wait out their socket timeout (30 s) while a new primary already serves. Cutting the
    socket (``shutdown``, from this thread) makes the thread that uses it see a closed connection, which it
    handles as any lost one: it connects again, to the new primary. Reads redis-py 8.1's pools'
    ``_get_free_connections`` and ``_get_in_use_connections`` (pinned in engine/upstream.py).
    """

    def __init__(self, target: SentinelTarget):
        super().__init__(name=f"gpulayer-sentinel-watch-{target.service}", daemon=True)
        self.target = target
        self.pools: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, pool) -> None:
        with self._lock:
            self.pools.add(pool)

    def run(self) -> None:
        tls = {"ssl": True, **self.target.tls_options} if self.target.tls else {}
        turn = 0
        while True:
            host, port = self.target.sentinels[turn % len(self.target.sentinels)]
            turn += 1
            try:
                with redis.Redis(host, port, password=self.target.sentinel_password, socket_connect_timeout=2,
                                 socket_keepalive=True, **tls) as sentinel:
                    pubsub = sentinel.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe("+switch-master")
                    for message in pubsub.listen():
                        self.switched(message.get("data"))
            except (redis.RedisError, OSError) as err:  # that sentinel went away: the next one
                log.debug("gpulayer: sentinel %s:%s for switches: %s", host, port, err)
                time.sleep(RETRY_EVERY)

    def switched(self, data) -> int:
        """``<name> <old ip> <old port> <new ip> <new port>``: cut every connection to the old primary; how many."""
        parts = (data.decode() if isinstance(data, bytes) else str(data or "")).split()
        if len(parts) != 5 or parts[0] != self.target.service:
            return 0
        old = (parts[1], int(parts[2]))
        forget_all()  # the new primary's replicas are not the old one's (store/in_sync.py)
        with self._lock:
            pools = list(self.pools)
        cut = 0
        for pool in pools:
            with pool._get_pool_lock():
                connections = [*pool._get_free_connections(), *pool._get_in_use_connections()]
            for connection in connections:
                sock = getattr(connection, "_sock", None)
                if sock is not None and (connection.host, int(connection.port)) == old:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                        cut += 1
                    except OSError:
                        pass
        if cut:
            log.warning("gpulayer: the Sentinel group %r switched to %s:%s; cut %d connection(s) to the old "
                        "primary %s:%s", self.target.service, parts[3], parts[4], cut, *old)
        return cut


_watches: dict[tuple, SwitchWatch] = {}
_watches_lock = threading.Lock()


def _watch(target: SentinelTarget, pool) -> None:
    key = (target.key(), target.service, os.getpid())  # a forked child starts its own
    with _watches_lock:
        watch = _watches.get(key)
        if watch is None:
            watch = _watches[key] = SwitchWatch(target)
            watch.start()
    watch.add(pool)


watch_pools(_watch)


def engine_url(url: str) -> tuple[str, dict]:
    """The URL kombu and Celery are given for ``url``, and the transport options to add: ``url`` itself and
    none for ``redis://`` and ``rediss://``."""
    if not is_sentinel_url(url):
        return url, {}
    target = parse_sentinel_url(url)
    auth = f":{quote(target.password, safe='')}@" if target.password else ""
    return (f"{'rediss' if target.tls else 'redis'}://{auth}{quote(target.service, safe='')}/{target.db}",
            {SENTINEL_OPTION: url})


def broker_url(app) -> str:
    """The broker URL as the user gave it (a Sentinel group's, not the one kombu was given): what gpulayer's own
    clients connect with (``store.connection.connect_redis``)."""
    return (app.conf.broker_transport_options or {}).get(SENTINEL_OPTION) or app.conf.broker_url


def target_of(transport_options: dict | None) -> SentinelTarget | None:
    url = (transport_options or {}).get(SENTINEL_OPTION)
    return parse_sentinel_url(url) if url else None


class SentinelPools:
    """For kombu's Redis channel: pools of connections to the group's primary when the broker is a Sentinel
    group (a mixin ahead of ``kombu.transport.redis.Channel``; the channel calls :meth:`_use_sentinel` first)."""

    _sentinel: SentinelTarget | None = None

    def _use_sentinel(self, transport) -> None:
        self._sentinel = target_of(transport.client.transport_options)
        if self._sentinel is not None:  # kombu's async Connection subclasses these: it must ask the sentinels too
            self.connection_class = managed_connection_class(None)
            self.connection_class_ssl = managed_connection_class(TLSConnection)

    def _get_pool(self, asynchronous=False):
        if self._sentinel is None:
            return super()._get_pool(asynchronous)
        params = self._connparams(asynchronous=asynchronous)
        self.keyprefix_fanout = self.keyprefix_fanout.format(db=params["db"])
        return sentinel_pool(self._sentinel, **params)


def backend_pool(app, params: dict):
    """The result backend's pool for a Sentinel broker (None for any other): the primary, asked of the sentinels."""
    target = target_of(app.conf.broker_transport_options)
    if target is None:
        return None
    params = {k: v for k, v in params.items() if k != "connection_class"}
    return sentinel_pool(target, tls_connection=TLSConnection, **params)
