"""The one way gpulayer connects to the cluster's Redis: every redis-py client it builds comes from here.

The broker URL carries its TLS options (``config.with_tls`` folds ``GPULAYER_SSL_*`` into its query), so a
worker's janitor, its gang agent, a rank and a client all connect the same way: plain for ``redis://``,
TLS for ``rediss://`` with the certificate checked unless the URL says otherwise. kombu's transport and
Celery's result backend take the same options from ``gpulayer.app.configure``.
"""

from __future__ import annotations

import redis

from ..config import with_tls


def connect_redis(url: str, **kwargs) -> redis.Redis:
    """A redis-py client for ``url`` (``redis://`` or ``rediss://``); ``kwargs`` go to ``redis.Redis``.

    For example ``connect_redis("rediss://:pw@redis:6380/0?ssl_ca_certs=/etc/gpulayer/ca.pem", socket_timeout=10)``.
    """
    return redis.Redis.from_url(with_tls(url), **kwargs)
