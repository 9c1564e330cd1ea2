"""Each host's copies of objects from a remote store (``s3://``): fetched once per host, shared by every worker
and pool process on it, mapped from there.

Layout, in the cluster's root on this machine (``store/cluster.py``'s ``machine_root``)::

    gpulayer-<cluster id>/object-cache/<oid>        a complete copy (renamed into place once whole)
    gpulayer-<cluster id>/object-cache/<oid>.lock   taken while one process fetches it

Bounded by ``object_cache_bytes`` (default 20% of the disk's free space at start, at least 1 GiB): before a fetch,
the least recently used copies go until the new one fits. A copy that a process has mapped may be unlinked: the
mapping keeps its pages until it is dropped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
from pathlib import Path
from typing import Callable

from .backends import OID, check_oid

CACHE_DIR = "object-cache"
MIN_DEFAULT = 2**30
DEFAULT_SHARE = 0.2


def default_limit(root: Path) -> int:
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    return max(int(shutil.disk_usage(where).free * DEFAULT_SHARE), MIN_DEFAULT)


class HostCache:
    """``path(oid, size, fetch)``: the local copy of ``oid``, fetched with ``fetch(tmp_path)`` if this host has none."""

    def __init__(self, root: Path, limit_bytes: int | None = None):
        self.root = Path(root)
        self.limit = limit_bytes if limit_bytes is not None else default_limit(self.root)
        self._lock = threading.Lock()

    def path(self, oid: str, size: int, fetch: Callable[[Path], None]) -> Path:
        final = self.root / check_oid(oid)
        if self._touch(final):
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.root / f"{oid}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch per host; the others wait, then find it there
            try:
                if self._touch(final):
                    return final
                self.make_room(size)
                tmp = self.root / f"{oid}.tmp-{os.getpid()}"
                try:
                    fetch(tmp)
                    os.replace(tmp, final)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
                return final
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
                with contextlib.suppress(FileNotFoundError):
                    (self.root / f"{oid}.lock").unlink()

    @staticmethod
    def _touch(path: Path) -> bool:
        """Mark ``path`` used now (its mtime orders eviction); False when it is not there."""
        try:
            os.utime(path)
            return True
        except FileNotFoundError:
            return False

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last used, size, path) of every complete copy, oldest first."""
        out = []
        try:
            with os.scandir(self.root) as it:
                for entry in it:
                    if OID.match(entry.name):
                        with contextlib.suppress(FileNotFoundError):
                            st = entry.stat(follow_symlinks=False)
                            out.append((st.st_mtime, st.st_size, Path(entry.path)))
        except FileNotFoundError:
            pass
        return sorted(out)

    def make_room(self, size: int) -> None:
        """Unlink the least recently used copies until ``size`` more bytes fit under the limit."""
        entries = self.entries()
        total = sum(s for _, s, _ in entries)
        for _, s, path in entries:
            if total + size <= self.limit:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= s

    def drop(self, oid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / check_oid(oid)).unlink()


_caches: dict[str, HostCache] = {}


def host_cache(client, limit_bytes: int | None = None) -> HostCache:
    """This host's cache for the cluster ``client`` talks to (one per process)."""
    from ..store.cluster import cluster_id, machine_root

    cid = cluster_id(client)
    cache = _caches.get(cid)
    if cache is None:
        cache = _caches[cid] = HostCache(machine_root(cid) / CACHE_DIR, limit_bytes)
    return cache


def cache_for_store(url: str, limit_bytes: int | None = None) -> HostCache:
    """This host's cache for the remote store ``url``, for a backend that knows only its URL: under the temp root,
    ``gpulayer-objects-<digest of the URL>/`` (the store names the objects' owner: oids are unique in it)."""
    import hashlib
    import tempfile

    key = "url:" + url
    cache = _caches.get(key)
    if cache is None:
        digest = hashlib.blake2b(url.encode(), digest_size=8).hexdigest()
        cache = _caches[key] = HostCache(Path(tempfile.gettempdir()) / f"gpulayer-objects-{digest}", limit_bytes)
    return cache
