"""What a cluster that ends for good leaves on this machine outside its home, and its removal.

A cluster's objects (``objects/``: the embedded default store), unpacked code (``code/``) and host cache
live in its root on this machine, ``<TMPDIR>/gpulayer-<cluster id>`` (``store/cluster.py``), not in its home:
once its Redis is gone for good (a process-scoped cluster at its script's end, a test fleet), no record
points at them and no sweep of a live cluster looks there, so they would stay on disk for ever.

A ``gpulayer up`` cluster's Redis reloads its append-only file at the next ``up`` (the same cluster id and
records), but that ``up`` has a new cluster secret, so no object signed with the old one would be readable:
``gpulayer down`` removes the root too, and a record left pointing at an object reads as ``ObjectMissing``
until its holders expire and a sweep drops it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis


def cluster_root(client: redis.Redis) -> Path | None:
    """The machine root of the cluster ``client`` talks to, or None if it has no id yet (nothing was written)."""
    from ..store import keys  # (imported here: ``gpulayer down`` and a script's exit need none of Redis's client)
    from ..store.cluster import machine_root

    value = client.get(keys.CLUSTER_ID)
    if value is None:
        return None
    return machine_root(value.decode() if isinstance(value, bytes) else str(value))


def remove_cluster_root(root: Path | None) -> None:
    """Remove a root whose cluster ended for good: every name in it is that cluster's alone."""
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
