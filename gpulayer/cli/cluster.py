"""The cluster a command talks to: the configured one, connected, or a ``ClusterUnavailable`` saying how to get one."""

from __future__ import annotations

from ..errors import ClusterUnavailable


def connected_client(doing: str):
    """Connect to the configured cluster and return its Redis client; ``doing`` completes "no cluster to ..."."""
    from .. import app as app_mod
    from ..config import load_settings
    from ..session import connect

    settings = load_settings()
    if not settings.broker_url:
        raise ClusterUnavailable(f"no cluster to {doing}: set GPULAYER_BROKER_URL (and GPULAYER_SECRET), "
                                 "or start one with `gpulayer up`")
    connect(settings)
    return app_mod.app.backend.client
