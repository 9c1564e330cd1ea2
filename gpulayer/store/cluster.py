"""The cluster's id: what names its local state on a host shared with other clusters.

Two clusters on one machine (two ``GPULAYER_HOME``\\ s, a test fleet beside ``gpulayer up``) both name
their workers ``local-1``, ``local-2`` and share the temp directory; what a worker keeps on disk is
therefore named after its cluster, which its own Redis names: a random id made once with ``SET NX``
by the first worker that asks (``gl:cluster:id`` in ``keys.py``), read by every worker at its start
and kept for its life. A worker gives its id back to a Redis that lost it (a restart without
persistence), so the workers after it keep using the same root.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

import redis

from . import keys


def cluster_id(client: redis.Redis, mine: str | None = None) -> str:
    """The id of the cluster whose Redis ``client`` talks to; made now if it has none (``mine`` if given)."""
    client.set(keys.CLUSTER_ID, mine or secrets.token_hex(8), nx=True)
    value = client.get(keys.CLUSTER_ID)
    return value.decode() if isinstance(value, bytes) else str(value)


ROOT_PREFIX = "gpulayer-"  # a cluster's root on this machine: gpulayer-<cluster id>


def machine_root(cluster_id: str, where: Path | None = None) -> Path:
    """The cluster's root on this machine: ``where`` (default the temp root, ``TMPDIR``) / ``gpulayer-<id>``.

    Gang directories (``gang/workdir.py``) and unpacked code (``workspace/cache.py``) live in it.
    """
    return Path(where if where is not None else tempfile.gettempdir()) / f"{ROOT_PREFIX}{_safe(cluster_id)}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def make_private(base: Path) -> Path:
    """Create ``base`` and its cluster root (this user's alone, 0700), whatever a sweep does meanwhile.

    A sweep on this machine removes the root once it is empty (``gang/workdir.py``'s ``sweep``), maybe
    between our making it and our making ``base`` in it: then both are made again. A root that exists but
    is not this user's own directory (another user made it first, in a shared ``/tmp``) is refused, not
    written into.
    """
    cluster_root = base.parent
    for _ in range(10):
        try:
            cluster_root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = cluster_root.lstat()
        except FileNotFoundError:  # a sweep removed the empty root between the two
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise PermissionError(f"{cluster_root} is not this user's own directory (owner uid {st.st_uid}, "
                                  f"mode {stat.S_IMODE(st.st_mode):o}); remove it, or give this worker a "
                                  "TMPDIR of its own")
        try:
            base.mkdir(exist_ok=True)
            return base
        except FileNotFoundError:  # a sweep removed the empty root just now
            continue
    raise OSError(f"cannot create {base}: its directory {cluster_root} keeps disappearing")
