"""Worker side of shipping the user's code: unpacked once per digest per machine, first on ``sys.path``.

Layout, in the cluster's root on this machine (``store/cluster.py``'s ``machine_root``)::

    gpulayer-<cluster id>/code/<digest>/       the unpacked archive (read-only use; never swept while used)
    gpulayer-<cluster id>/code/<digest>.lock   taken while one process unpacks it (pool processes race)

A process that first meets a digest fetches it (one GET), unpacks it into a temporary directory and
renames that into place: a directory that exists is complete. After that, a job with the same digest
costs a string comparison. A job with another digest (the user changed a module) takes the previous
one's modules out of ``sys.modules`` and its directory off ``sys.path``, so no job sees another
project's version of ``mylib``.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from .. import signing
from ..store import keys
from ..store.cluster import cluster_id, machine_root, make_private
from . import archive

_active: str | None = None  # the digest whose directory is on sys.path now
_active_dir: str | None = None
_ready: dict[str, str] = {}  # digest -> its directory, known complete on this machine
_cluster_root: Path | None = None
CODE_DIR = "code"  # in the cluster's root
IDLE = keys.CODE_TTL  # an unpacked archive no process here used for this long goes at a sweep
TOUCH_EVERY = 3600.0  # a process that keeps using one archive marks it in use this often
_touched = 0.0


class CodeMissing(RuntimeError):
    """The job's code is not in Redis any more (it expired, or the broker lost it): send the job again."""


def code_root(client) -> Path:
    """``<temp root>/gpulayer-<cluster id>/code`` on this machine (read once per process)."""
    global _cluster_root
    if _cluster_root is None:
        _cluster_root = machine_root(cluster_id(client)) / CODE_DIR
    return _cluster_root


def enter(digest: str | None, redis_client: Callable[[], object]) -> None:
    """Make ``digest``'s code importable in this process (None: no shipped code), for the job about to run.

    ``redis_client()`` gives the cluster's Redis, called only when this process first meets ``digest``.
    """
    global _active, _active_dir, _touched
    if digest == _active:
        if digest is not None and time.monotonic() - _touched > TOUCH_EVERY:
            _touch(_active_dir)
        return
    where = _ready.get(digest) if digest else None
    if digest and (where is None or not os.path.isdir(where)):  # new here, or swept since this process used it
        where = _ready[digest] = str(ensure(digest, redis_client()))
    if where is not None:
        _touch(where)
    _leave()
    if where is not None:
        sys.path.insert(0, where)
        importlib.invalidate_caches()
    _active, _active_dir = digest, where


def _touch(where: str) -> None:
    """Mark ``where`` as in use now: a sweep leaves it for another ``IDLE`` seconds."""
    global _touched
    _touched = time.monotonic()
    try:
        os.utime(where)
    except OSError:
        pass


def _leave() -> None:
    """Take the active code's directory off ``sys.path`` and its modules out of ``sys.modules``."""
    global _active, _active_dir
    old = _active_dir
    _active = _active_dir = None
    if old is None:
        return
    while old in sys.path:
        sys.path.remove(old)
    prefix = old + os.sep
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if file.startswith(prefix):
            del sys.modules[name]
    from ..payload import forget_loaded

    forget_loaded()  # functions unpickled against those modules


def ensure(digest: str, client) -> Path:
    """The directory of ``digest`` on this machine, fetched and unpacked if no process here has yet."""
    base = code_root(client)
    where = base / digest
    if where.is_dir():
        return where
    make_private(base)
    with open(base / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one unpacker per machine; the others wait, then find it there
        if where.is_dir():
            return where
        blob = client.get(keys.code_archive(digest))
        if blob is None:
            raise CodeMissing(f"the code this job was sent with (archive {digest}) is not in Redis any more "
                              "(expired or lost with the broker's data); send the job again from its client")
        tmp = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=base))
        try:
            archive.unpack(signing.verify(blob), tmp)
            tmp.rename(where)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return where


def sweep(base: Path, idle: float = IDLE) -> list[str]:
    """Remove the archives under ``base`` that no process on this machine took up for ``idle`` seconds."""
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False) and now - entry.stat().st_mtime > idle:
                shutil.rmtree(entry.path, ignore_errors=True)
                Path(entry.path + ".lock").unlink(missing_ok=True)
                removed.append(entry.name)
        except OSError:
            continue
    try:
        base.rmdir()  # only when empty
    except OSError:
        pass
    return removed


def explain(err: ModuleNotFoundError, digest: str | None, worker: str | None) -> ModuleNotFoundError:
    """``err`` (a module missing on this worker) as one line naming the module, the worker and the fix."""
    name = err.name or str(err)
    where = f"worker {worker}" if worker else "this worker"
    shipped = _ready.get(digest) if digest else None
    if shipped is not None:
        root = archive.manifest(Path(shipped)).get("root")
        why = f"it is not in the shipped code (root {root})" if root else "it is not in the shipped code"
    else:
        why = "no code was shipped with this job"
    out = ModuleNotFoundError(f"No module named {name!r} on {where}: {why}; pass working_dir= or py_modules=, "
                              "or install it on the workers", name=err.name, path=err.path)
    out.gpulayer_explained = True
    return out


def explained(err: BaseException) -> bool:
    return bool(getattr(err, "gpulayer_explained", False))
