"""Where objects' bytes live: the ``Backend`` protocol, the local (or shared) directory, and one backend per URL.

A store is named by a URL: ``file:///abs/dir`` (or a plain path) for a directory on this host or on a shared
file system every host mounts at the same path, ``s3://bucket/prefix`` for S3-compatible storage
(``gpulayer/objects/s3.py``). Each object is one file named by its oid, written atomically: a reader never sees
half of one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, ContextManager, Protocol
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError

OID = re.compile(r"^[0-9a-f]{32}$")
# What a store directory may hold: objects, and the temporary files of writers (alive or dead).
_NAME = re.compile(r"^[0-9a-f]{32}(\.tmp-[0-9]+-[0-9a-f]+)?$")
WRITE_CHUNK = 1 << 20  # buffered writes: bigger ones go straight from the caller's memory to the file


class Backend(Protocol):
    """What the object store needs of a place that holds bytes (``LocalDir``; ``s3.S3``)."""

    url: str

    def writer(self, oid: str) -> ContextManager[BinaryIO]:
        """A binary file to write the object into; it appears under ``oid`` only when the block ends without
        an error (tmp + rename, or a completed multipart upload)."""

    def put_file(self, oid: str, path: Path) -> None:
        """Store the file at ``path`` (written elsewhere) as ``oid``."""

    def local_path(self, oid: str) -> Path:
        """A path on this host holding the object, to map: the file itself, or this host's cached copy."""

    def delete(self, oid: str) -> None:
        """Remove ``oid`` (or a name ``list_old`` gave); one already gone is fine."""

    def list_old(self, older_than_s: float) -> Iterator[tuple[str, float]]:
        """(name, mtime) of every entry older than ``older_than_s`` seconds: objects and writers' leftovers."""

    def free_bytes(self) -> int | None:
        """Bytes the backend can still take, None where it cannot tell (S3)."""


def check_oid(oid: str) -> str:
    if not OID.match(oid):
        raise ValueError(f"not an object id: {oid!r} (32 hex digits)")
    return oid


class LocalDir:
    """A directory on this host (the embedded cluster's default) or a shared file system path."""

    def __init__(self, url: str):
        self.root = Path(local_root(url))
        self.url = self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalDir({str(self.root)!r})"

    def path(self, oid: str) -> Path:
        return self.root / check_oid(oid)

    @contextlib.contextmanager
    def writer(self, oid: str) -> Iterator[BinaryIO]:
        final = self.path(oid)
        if not self.root.is_dir():
            self._make_root()
        tmp = self.root / f"{oid}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            f = open(tmp, "xb", buffering=WRITE_CHUNK)
        except OSError as err:
            raise ConfigError(f"object store {self.url}: cannot write into {self.root} ({err.strerror}); give "
                              "GPULAYER_OBJECT_STORE a directory this user can write") from err
        try:
            yield f
            f.close()
            os.replace(tmp, final)
        except BaseException:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise

    def _make_root(self) -> None:
        """Make the store's directory, this user's alone (0700: objects are the jobs' data).

        The embedded cluster's default, in its root on this machine, is made as the rest of that root is
        (``store/cluster.py``). Any other path is made only if its parent exists: a typo in a shared file
        system's mount point is refused, not turned into a directory of this host that no other host sees.
        """
        from ..store.cluster import ROOT_PREFIX, make_private

        try:
            if self.root.parent.name.startswith(ROOT_PREFIX):
                make_private(self.root)
            else:
                self.root.mkdir(mode=0o700, exist_ok=True)
        except FileNotFoundError as err:
            raise ConfigError(f"object store {self.url}: {self.root.parent} does not exist; create the store's "
                              "directory (on a shared file system, where every host mounts it) or correct "
                              "GPULAYER_OBJECT_STORE") from err
        except FileExistsError as err:
            raise ConfigError(f"object store {self.url}: {self.root} is a file, not a directory; give "
                              "GPULAYER_OBJECT_STORE a directory") from err
        except OSError as err:
            raise ConfigError(f"object store {self.url}: cannot create {self.root} ({err.strerror or err}); give "
                              "GPULAYER_OBJECT_STORE a directory this user can write") from err

    def put_file(self, oid: str, path: Path) -> None:
        with self.writer(oid) as out, open(path, "rb") as src:
            shutil.copyfileobj(src, out, WRITE_CHUNK * 16)

    def local_path(self, oid: str) -> Path:
        return self.path(oid)

    def delete(self, oid: str) -> None:
        if not _NAME.match(oid):
            raise ValueError(f"not an object or temporary file name: {oid!r}")
        with contextlib.suppress(FileNotFoundError):
            (self.root / oid).unlink()

    def list_old(self, older_than_s: float) -> Iterator[tuple[str, float]]:
        cutoff = time.time() - older_than_s
        try:
            entries = os.scandir(self.root)
        except FileNotFoundError:
            return
        with entries:
            for entry in entries:
                if not _NAME.match(entry.name):
                    continue
                try:
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                except FileNotFoundError:
                    continue
                if mtime < cutoff:
                    yield entry.name, mtime

    def free_bytes(self) -> int | None:
        where = self.root
        while not where.exists() and where != where.parent:  # not made yet: the disk it will be made on
            where = where.parent
        return shutil.disk_usage(where).free


def local_root(url: str) -> str:
    """The absolute directory of a ``file://`` URL or a plain path."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"object store {url!r}: a file:// URL names a path on this host (file:///abs/dir); "
                              "for a shared file system give the path where every host mounts it")
        path = unquote(parts.path)
    elif parts.scheme == "" or (len(parts.scheme) == 1 and os.name == "nt"):
        path = url
    else:
        raise ConfigError(f"object store {url!r} is not a file:// URL or a path")
    path = os.path.expanduser(path)
    if not os.path.isabs(path):  # each process would resolve it against its own working directory
        raise ConfigError(f"object store {url!r} is a relative path: every client and worker must find the same "
                          "directory, so give it absolute (file:///abs/dir or /abs/dir)")
    return os.path.abspath(path)


def normal_url(url: str) -> str:
    """The one spelling of a store URL (a plain path -> ``file:///abs/path``), so refs compare and cache by it."""
    scheme = urlsplit(url).scheme
    if scheme in ("", "file"):
        return Path(local_root(url)).as_uri()
    return url.rstrip("/")


# scheme -> "module:class"; a backend's module is imported only when a store of its kind is first used.
SCHEMES = {"file": f"{__name__}:LocalDir", "": f"{__name__}:LocalDir", "s3": "gpulayer.objects.s3:S3"}
_backends: dict[str, Backend] = {}
_lock = threading.Lock()


def backend_for(url: str) -> Backend:
    """This process's backend for store ``url`` (one per URL per process)."""
    url = normal_url(url)
    backend = _backends.get(url)
    if backend is None:
        with _lock:
            backend = _backends.get(url)
            if backend is None:
                backend = _backends[url] = _make(url)
    return backend


def _make(url: str) -> Backend:
    import importlib

    scheme = urlsplit(url).scheme
    where = SCHEMES.get(scheme)
    if where is None:
        raise ConfigError(f"object store {url!r}: gpulayer stores objects in a directory (file:///path or a "
                          f"plain path) or in S3-compatible storage (s3://bucket/prefix), not {scheme}://")
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)(url)
