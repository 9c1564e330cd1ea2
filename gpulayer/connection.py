"""This process's connection to a cluster: ``connect``, ``init`` and ``ensure_connected``.

Below both the client API (``client.py``) and the tasks (``tasks/submit.py``), which connect
on first use: neither imports the other for it.
"""

from __future__ import annotations

import threading
from urllib.parse import urlparse

import redis

from . import app as app_mod
from .config import Settings, load_settings
from .errors import ClusterUnavailable, ConfigError
from .store.connection import connect_redis

_init_lock = threading.RLock()
_local = None  # the process-scoped embedded cluster init() started, if any


def connect(settings: Settings) -> Settings:
    """Point this process at the cluster ``settings`` names; fail fast if Redis is unreachable."""
    client = connect_redis(settings.broker_url, socket_connect_timeout=settings.connect_timeout,
                           socket_timeout=settings.connect_timeout)
    where = urlparse(settings.broker_url)
    try:
        client.ping()
    except redis.AuthenticationError as err:
        if not where.password:
            raise ClusterUnavailable(f"Redis at {where.hostname}:{where.port} needs a password: put it in the "
                                     "broker URL, redis://:PASSWORD@host:port/0") from err
        raise ClusterUnavailable(f"Redis at {where.hostname}:{where.port} refused the password in the broker URL: "
                                 f"{err}; check GPULAYER_BROKER_URL") from err
    except redis.ResponseError as err:
        if "NOAUTH" in str(err) or "AUTH" in str(err):
            raise ClusterUnavailable(f"Redis at {where.hostname}:{where.port} needs a password: put it in the "
                                     "broker URL, redis://:PASSWORD@host:port/0") from err
        raise
    except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
        raise ClusterUnavailable(f"cannot reach Redis at {where.hostname}:{where.port} within "
                                 f"{settings.connect_timeout:.0f}s ({err}); is it running, and is the "
                                 "broker URL right?") from err
    finally:
        client.close()
    if not settings.secret:
        raise ConfigError("no cluster secret: set GPULAYER_SECRET to the secret the workers use "
                          "(`gpulayer up` writes one to its state file)")
    app_mod.configure(settings)
    return settings


def init(broker_url: str | None = None, *, secret: str | None = None, workers: int | None = None,
         slots: int | None = None) -> Settings:
    """Connect to a cluster, starting an embedded one if none is configured.

    In order: ``broker_url`` / ``GPULAYER_BROKER_URL`` / the config file; else a
    running ``gpulayer up`` cluster; else a new embedded cluster (Redis and
    ``workers`` local workers) that lives as long as this process.
    """
    global _local
    with _init_lock:
        settings = load_settings(broker_url=broker_url, secret=secret)
        if settings.broker_url and not settings.broker_from_state:
            return connect(settings)
        if settings.broker_from_state:
            try:
                return connect(settings)
            except ClusterUnavailable:
                pass  # a stale state file: the `gpulayer up` cluster is gone
        if _local is None:
            from .local import start_for_process

            _local = start_for_process(workers=workers, slots=slots)
        return connect(load_settings(broker_url=_local.broker_url, secret=_local.secret))


def ensure_connected() -> None:
    """Connect as ``init()`` does, unless this process is connected already (the API calls this first)."""
    if not app_mod.is_configured():
        init()
