"""The one way gpulayer connects to the cluster's Redis: every redis-py client it builds comes from here.

The broker URL carries its TLS options (``config.with_tls`` folds ``GPULAYER_SSL_*`` into its query), so a
worker's janitor, its gang agent, a rank and a client all connect the same way: plain for ``redis://``,
TLS for ``rediss://`` with the certificate checked unless the URL says otherwise. kombu's transport and
Celery's result backend take the same options from ``gpulayer.app.configure`` and the same connection
class (engine/redis_tls.py's ``TLSConnection``, installed here with :func:`use_for_tls`).

A ``sentinel://`` (``sentinels://``) URL names a Sentinel group: its clients connect to whichever server the
sentinels say is the primary, and find the new one after a failover (``store/sentinel.py``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import redis

from ..config import with_tls
from ..errors import ClusterUnavailable
from ..masking import mask_url
from ..sentinel_url import is_sentinel_url, parse_sentinel_url
from .sentinel import sentinel_pool

# The connection class of rediss:// clients: redis-py's, until engine/redis_tls.py (imported with the Celery app's
# transport and result backend) installs its own, one SSLContext per process (store/ never imports engine/).
_tls_connection: type[redis.Connection] = redis.SSLConnection


def use_for_tls(connection_class: type[redis.Connection]) -> None:
    """Make every rediss:// client :func:`connect_redis` builds from now on use ``connection_class``."""
    global _tls_connection
    _tls_connection = connection_class


def client_name(worker_id: str, use: str) -> str:
    """The name a worker's connection shows in ``CLIENT LIST`` (``CLIENT SETNAME``, sent once per connection):
    ``gpulayer:<worker id>:<use>``, so an operator counts each worker's connections and sees what holds them."""
    return f"gpulayer:{''.join(c if c.isprintable() and not c.isspace() else '_' for c in worker_id)}:{use}"


def connect_redis(url: str, *, name: str | None = None, one_connection: bool = False, **kwargs) -> redis.Redis:
    """A redis-py client for ``url`` (``redis://``, ``rediss://``, or a Sentinel group's ``sentinel://`` /
    ``sentinels://``); ``kwargs`` go to ``redis.Redis``.

    ``name``: the connection's client name (``client_name``). ``one_connection``: every thread using the
    client shares one connection, each command waiting for the one before (a worker's heartbeat and
    janitor: never a blocking read, which would hold it), instead of one more connection per thread
    that happens to use it at the same moment.

    For example ``connect_redis("rediss://:pw@redis:6380/0?ssl_ca_certs=/etc/gpulayer/ca.pem", socket_timeout=10)``.
    """
    url = with_tls(url)
    if name:
        kwargs.setdefault("client_name", name)
    if is_sentinel_url(url):
        single = kwargs.pop("single_connection_client", False)  # the client's, not its connections'
        return redis.Redis(connection_pool=sentinel_pool(url, tls_connection=_tls_connection, blocking=one_connection,
                                                         **kwargs), single_connection_client=single)
    if urlsplit(url).scheme == "rediss":
        kwargs.setdefault("connection_class", _tls_connection)
    if one_connection:
        return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, max_connections=1, **kwargs))
    return redis.Redis.from_url(url, **kwargs)


def reachable(url: str, connect_timeout: float, socket_timeout: float | None = None) -> redis.Redis:
    """A client of the Redis at ``url`` that has answered a PING; else ``ClusterUnavailable`` saying why.

    ``socket_timeout``: for the client's later commands (default ``connect_timeout``). The caller
    closes it (``gpulayer.connect`` checks with it; ``gpulayer status`` reads with it).
    """
    client = connect_redis(url, socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout or connect_timeout)
    where, password = describe(url), urlsplit(url).password
    example = "sentinel://:PASSWORD@host:port,.../<master name>" if is_sentinel_url(url) else "redis://:PASSWORD@host:port/0"
    needs_password = f"{where} needs a password: put it in the broker URL, {example}"
    try:
        client.ping()
    except redis.AuthenticationError as err:
        client.close()
        if not password:
            raise ClusterUnavailable(needs_password) from err
        raise ClusterUnavailable(f"{where} refused the password in the broker URL: {err}; check "
                                 "GPULAYER_BROKER_URL") from err
    except redis.ResponseError as err:
        client.close()
        if "NOAUTH" in str(err) or "AUTH" in str(err):
            raise ClusterUnavailable(needs_password) from err
        raise
    except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
        client.close()
        raise ClusterUnavailable(f"cannot reach {where} ({mask_url(url)}) within {connect_timeout:.0f}s "
                                 f"({mask_url(str(err))}); is it running, and is the broker URL right?") from err
    return client


def describe(url: str) -> str:
    """Where ``url`` points, for a message: ``Redis at host:port``, or the Sentinel group and its sentinels."""
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        sentinels = ", ".join(f"{h}:{p}" for h, p in target.sentinels)
        return f"the primary of Sentinel group {target.service!r} (sentinels {sentinels})"
    where = urlsplit(url)
    return f"Redis at {where.hostname}:{where.port}"
