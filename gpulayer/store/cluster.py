"""The cluster's id: what names its local state on a host shared with other clusters.

Two clusters on one machine (two ``GPULAYER_HOME``\\ s, a test fleet beside ``gpulayer up``) both name
their workers ``local-1``, ``local-2`` and share the temp directory; what a worker keeps on disk is
therefore named after its cluster, which its own Redis names: a random id made once with ``SET NX``
by the first worker that asks (``gl:cluster:id`` in ``keys.py``), read by every worker at its start
and kept for its life. A worker gives its id back to a Redis that lost it (a restart without
persistence), so the workers after it keep using the same root.
"""

from __future__ import annotations

import secrets

import redis

from . import keys


def cluster_id(client: redis.Redis, mine: str | None = None) -> str:
    """The id of the cluster whose Redis ``client`` talks to; made now if it has none (``mine`` if given)."""
    client.set(keys.CLUSTER_ID, mine or secrets.token_hex(8), nx=True)
    value = client.get(keys.CLUSTER_ID)
    return value.decode() if isinstance(value, bytes) else str(value)
