"""The one way gpulayer connects to the cluster's Redis: every redis-py client it builds comes from here.

The broker URL carries its TLS options (``config.with_tls`` folds ``GPULAYER_SSL_*`` into its query), so a
worker's janitor, its gang agent, a rank and a client all connect the same way: plain for ``redis://``,
TLS for ``rediss://`` with the certificate checked unless the URL says otherwise. kombu's transport and
Celery's result backend take the same options from ``gpulayer.app.configure`` and the same connection
class, :class:`TLSConnection`.
"""

from __future__ import annotations

import os
import ssl
import threading
from urllib.parse import urlsplit

import redis

from ..config import with_tls
from ..errors import ClusterUnavailable

# Written for redis-py 8.1: engine/upstream.py pins the source of the method this overrides (tests/test_engine_contract.py).
_contexts: dict[tuple, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


class TLSConnection(redis.SSLConnection):
    """redis-py's TLS connection, with one ``SSLContext`` per process and options instead of one per connection.

    redis-py builds a context for every connection, loading the system's CA bundle each time (45 ms of CPU
    per connection on a busy machine with OpenSSL 3): that made every job that opens a client, and every
    worker start, several times slower over TLS. The context is built as redis-py builds it, and built
    again when a certificate or key file changes on disk (a rotated certificate takes effect on the next
    connection, as it does in redis-py).
    """

    def _wrap_socket_with_ssl(self, sock):
        if self.ssl_validate_ocsp or self.ssl_validate_ocsp_stapled:  # rare: redis-py's own path, uncached
            return super()._wrap_socket_with_ssl(sock)
        return self._context().wrap_socket(sock, server_hostname=self.host)

    def _context(self) -> ssl.SSLContext:
        files = (self.certfile, self.keyfile, self.ca_certs)
        key = (self.cert_reqs, self.check_hostname, self.ca_path, self.ca_data, self.ssl_min_version,
               self.ssl_ciphers, self.certificate_password,
               tuple(self.ssl_include_verify_flags or ()), tuple(self.ssl_exclude_verify_flags or ()),
               *((f, os.stat(f).st_mtime_ns) if f else None for f in files))
        with _contexts_lock:
            context = _contexts.get(key)
            if context is None:
                context = _contexts[key] = self._build_context()
        return context

    def _build_context(self) -> ssl.SSLContext:
        """The context redis-py 8.1's ``SSLConnection._wrap_socket_with_ssl`` builds."""
        context = ssl.create_default_context()
        context.check_hostname = self.check_hostname
        context.verify_mode = self.cert_reqs
        for flag in self.ssl_include_verify_flags or ():
            context.verify_flags |= flag
        for flag in self.ssl_exclude_verify_flags or ():
            context.verify_flags &= ~flag
        if self.certfile or self.keyfile:
            context.load_cert_chain(certfile=self.certfile, keyfile=self.keyfile,
                                    password=self.certificate_password)
        if self.ca_certs is not None or self.ca_path is not None or self.ca_data is not None:
            context.load_verify_locations(cafile=self.ca_certs, capath=self.ca_path, cadata=self.ca_data)
        if self.ssl_min_version is not None:
            context.minimum_version = self.ssl_min_version
        if self.ssl_ciphers:
            context.set_ciphers(self.ssl_ciphers)
        return context


def client_name(worker_id: str, use: str) -> str:
    """The name a worker's connection shows in ``CLIENT LIST`` (``CLIENT SETNAME``, sent once per connection):
    ``gpulayer:<worker id>:<use>``, so an operator counts each worker's connections and sees what holds them."""
    return f"gpulayer:{''.join(c if c.isprintable() and not c.isspace() else '_' for c in worker_id)}:{use}"


def connect_redis(url: str, *, name: str | None = None, one_connection: bool = False, **kwargs) -> redis.Redis:
    """A redis-py client for ``url`` (``redis://`` or ``rediss://``); ``kwargs`` go to ``redis.Redis``.

    ``name``: the connection's client name (``client_name``). ``one_connection``: every thread using the
    client shares one connection, each command waiting for the one before (a worker's heartbeat and
    janitor: never a blocking read, which would hold it), instead of one more connection per thread
    that happens to use it at the same moment.

    For example ``connect_redis("rediss://:pw@redis:6380/0?ssl_ca_certs=/etc/gpulayer/ca.pem", socket_timeout=10)``.
    """
    url = with_tls(url)
    if urlsplit(url).scheme == "rediss":
        kwargs.setdefault("connection_class", TLSConnection)
    if name:
        kwargs.setdefault("client_name", name)
    if one_connection:
        return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, max_connections=1, **kwargs))
    return redis.Redis.from_url(url, **kwargs)


def reachable(url: str, connect_timeout: float, socket_timeout: float | None = None) -> redis.Redis:
    """A client of the Redis at ``url`` that has answered a PING; else ``ClusterUnavailable`` saying why.

    ``socket_timeout``: for the client's later commands (default ``connect_timeout``). The caller
    closes it (``gpulayer.connect`` checks with it; ``gpulayer status`` reads with it).
    """
    client = connect_redis(url, socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout or connect_timeout)
    where = urlsplit(url)
    needs_password = (f"Redis at {where.hostname}:{where.port} needs a password: put it in the broker URL, "
                      "redis://:PASSWORD@host:port/0")
    try:
        client.ping()
    except redis.AuthenticationError as err:
        client.close()
        if not where.password:
            raise ClusterUnavailable(needs_password) from err
        raise ClusterUnavailable(f"Redis at {where.hostname}:{where.port} refused the password in the broker URL: "
                                 f"{err}; check GPULAYER_BROKER_URL") from err
    except redis.ResponseError as err:
        client.close()
        if "NOAUTH" in str(err) or "AUTH" in str(err):
            raise ClusterUnavailable(needs_password) from err
        raise
    except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
        client.close()
        raise ClusterUnavailable(f"cannot reach Redis at {where.hostname}:{where.port} within "
                                 f"{connect_timeout:.0f}s ({err}); is it running, and is the "
                                 "broker URL right?") from err
    return client
