"""A gang's working directory on one worker: torchrun's working-directory contract for ``gpulayer train``.

Every rank of one node runs in the same directory, the working directory the client shipped,
unpacked once per node by the worker's gang agent. At the end, node 0 packs the files its ranks
created or changed for the client, and the directory is removed (unless the client asked to keep it).

A restarted attempt (``max_restarts``) starts, on every node, from what a shared file system would
have shown: node 0's directory at the end of the failed attempt (``restart_from="node0"``, the
default). Node 0's agent packs its new and changed files into Redis when the attempt fails with a
restart to come, and each node of the next attempt unpacks them over a fresh copy of what was shipped
(``for_attempt``), so a script whose rank 0 saves a snapshot resumes on every node from the same epoch.
``"own"`` keeps each worker's own directory across attempts (a restart on another worker starts there
from the shipped copy); ``"fresh"`` starts every node from the shipped copy again.

Layout, under the cluster's root on this machine: ``<temp root>/gpulayer-<cluster id>/``, where the
temp root is ``tempfile.gettempdir()`` (``TMPDIR``) and the cluster id is the random id the cluster's
Redis holds (``store/cluster.py``). Two clusters on one host name their workers alike (``local-1``)
and share the temp root; each has its own root, so neither ever sees, let alone sweeps, the other's::

    gpulayer-<cluster id>/          mode 0700, this user's; removed by a sweep once empty
        gang-<gang id>-<worker id>/
            work/           the ranks' working directory, and GPULAYER_WORKDIR
            manifest.json   {"gang_id", "worker", "files": {path: [size, mtime_ns]}} as unpacked
            kept            present when the client asked to keep it (--keep-workdir); never swept
            torchrun/       torchrun's logs (``launcher="torchrun"``; gangs without a working directory too)

A directory is removed by the agent that used it once the gang is certainly over, or else by that
worker's sweep (at start-up, every few seconds, at shutdown) once the gang's record says it ended.
A sweep looks only under its own cluster's root, at its own worker's directories.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..models import WorkdirSpec
from ..store.cluster import machine_root, make_private
from ..workspace.archive import MANIFEST as CODE_MANIFEST

# A cluster's root on this machine (``root``: gpulayer-<cluster id>) and the one way to make a directory in it
# (``make``) live with the cluster's id (store/cluster.py): the code cache (workspace/cache.py) is there too.
root, make = machine_root, make_private
PREFIX = "gang-"  # a gang's directory on one worker, in its cluster's root: gang-<gang id>-<worker id>
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache",
             ".ipynb_checkpoints", "node_modules", "wandb"}  # never pulled back: caches the ranks made
MAX_PULL_BYTES = 48 * 2**20  # what comes back, uncompressed; under the 64 MiB message limit


@dataclass(frozen=True)
class ShippedDir:
    """A working directory that travels with a gang: ``archive`` is a gzipped tar of it.

    ``keep``: leave it on the workers at the end; ``pull``: node 0's new and changed files come back.
    """

    archive: bytes
    keep: bool = False
    pull: bool = True
    max_pull_bytes: int = MAX_PULL_BYTES
    restart_from: str = "node0"  # a restart starts from node 0's files ("node0"), its own ("own"), the shipped ("fresh")

    def spec(self) -> WorkdirSpec:
        return WorkdirSpec(keep=self.keep, pull=self.pull, max_pull_bytes=self.max_pull_bytes,
                           restart_from=self.restart_from)

    def code(self):
        """The archive as the code every job ships (``gpulayer/workspace/``): by its content's digest."""
        from ..workspace.archive import Archive, digest_of

        return Archive(digest_of(self.archive), self.archive, "", ())


class PullTooBig(Exception):
    """Node 0's new and changed files exceed the pull limit; the message names the biggest."""


def _safe(worker_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", worker_id)


def base_for(where: Path, gang_id: str, worker_id: str) -> Path:
    """Gang ``gang_id``'s directory on worker ``worker_id``, in the cluster root ``where`` (``root()``)."""
    return where / f"{PREFIX}{_safe(gang_id)}-{_safe(worker_id)}"


def prepare(base: Path, gang_id: str, worker_id: str, archive: Callable[[], bytes], keep: bool) -> Path:
    """The ranks' working directory under ``base``: unpacked from ``archive()`` the first time, reused after.

    Called by the agent before its node's ranks start, once per node, so no lock is needed.
    """
    work, manifest = base / "work", base / "manifest.json"
    if manifest.is_file() and work.is_dir():  # an earlier attempt of this gang ran here: resume in it
        return work
    shutil.rmtree(base, ignore_errors=True)  # half made (a worker killed while unpacking)
    make(base)
    work.mkdir()
    if keep:
        (base / "kept").touch()
    with tarfile.open(fileobj=io.BytesIO(archive()), mode="r:gz") as tar:
        tar.extractall(work, filter="data")
    (work / CODE_MANIFEST).unlink(missing_ok=True)  # the archive's note of where it was packed: not the user's
    files = {rel: [st.st_size, st.st_mtime_ns] for rel, st in _files(work)}
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gang_id": gang_id, "worker": worker_id, "files": files}))
    tmp.replace(manifest)  # written last: a directory with a manifest is complete
    return work


def _files(work: Path) -> Iterable[tuple[str, os.stat_result]]:
    for dirpath, dirs, names in os.walk(work):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(names):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            yield str(path.relative_to(work)), path.stat()


def changed(base: Path) -> list[tuple[str, int]]:
    """(path, size) of every file in ``base/work`` that is new or changed since it was unpacked."""
    shipped = json.loads((base / "manifest.json").read_text())["files"]
    return [(rel, st.st_size) for rel, st in _files(base / "work")
            if shipped.get(rel) != [st.st_size, st.st_mtime_ns]]


def collect(base: Path, max_bytes: int = MAX_PULL_BYTES) -> tuple[bytes, list[tuple[str, int]]]:
    """A gzipped tar of the new and changed files, and their (path, size); ``PullTooBig`` past ``max_bytes``."""
    files = changed(base)
    total = sum(size for _, size in files)
    if total > max_bytes:
        biggest = ", ".join(f"{rel} ({size / 2**20:.1f} MiB)" for rel, size in
                            sorted(files, key=lambda f: -f[1])[:3])
        raise PullTooBig(f"node 0's ranks wrote {total / 2**20:.1f} MiB in their working directory, over the "
                         f"{max_bytes / 2**20:.0f} MiB that can come back (biggest: {biggest}); write large "
                         "outputs to shared storage, or keep the directory with --keep-workdir")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:  # snapshots hardly compress
        for rel, _ in files:
            tar.add(base / "work" / rel, arcname=rel, recursive=False)
    return buf.getvalue(), files


def unpack_pulled(blob: bytes, dest: Path) -> list[str]:
    """Client side: write what came back into ``dest``; returns the paths written."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
        tar.extractall(dest, filter="data")
    return names


@dataclass(frozen=True)
class Node0Files:
    """What node 0's agent packed at the end of attempt ``attempt``: ``archive`` (gzipped tar), or ``error``."""

    attempt: int
    worker: str
    archive: bytes | None = None
    error: str | None = None


def for_attempt(base: Path, gang_id: str, worker_id: str, archive: Callable[[], bytes], keep: bool, *,
                attempt: int, restart_from: str, node0: Callable[[], Node0Files | None]) -> tuple[Path, str]:
    """The ranks' working directory for ``attempt`` of a gang on this worker, and how it was made.

    The first attempt, and every attempt under ``"own"``, is ``prepare``'s (this worker's directory
    if an earlier attempt ran here). ``"fresh"``: the shipped copy again. ``"node0"``: the shipped copy
    with node 0's files of the attempt before unpacked over it, unless this worker was that node 0 and
    still has its directory (it is those files already); without node 0's files (its worker was lost,
    or they were over the size limit) each node keeps its own, and the how says why.
    """
    def own() -> Path:
        return prepare(base, gang_id, worker_id, archive, keep)

    if attempt == 0 or restart_from == "own":
        return own(), "own"
    if restart_from == "fresh":
        remove(base)
        return own(), "fresh"
    files = node0()
    if files is None or files.attempt != attempt - 1:
        return own(), f"own: node 0's files of attempt {attempt - 1} are not there (its worker was lost?)"
    if files.error is not None or files.archive is None:
        return own(), f"own: {files.error}"
    if files.worker == worker_id and (base / "manifest.json").is_file() and (base / "work").is_dir():
        return own(), "node0: this worker was node 0"
    remove(base)
    work = own()
    names = _overlay(base, files.archive)
    return work, f"node0: {len(names)} files from {files.worker}"


def _overlay(base: Path, blob: bytes) -> list[str]:
    """Unpack node 0's files over ``base/work``; they count as changed since shipping (they come back)."""
    names = unpack_pulled(blob, base / "work")
    manifest = base / "manifest.json"
    record = json.loads(manifest.read_text())
    for name in names:
        record["files"].pop(name, None)
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(manifest)
    return names


def remove(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)


def end_of_attempt(outcome: str, attempt: int, max_restarts: int, *, cancelled: bool, aborted: bool,
                   all_results: bool) -> tuple[bool, bool]:
    """(pull now, remove now) for one node's directory when its attempt ends.

    Pull when this attempt may be the last (a success, a cancel, no restarts left): the
    snapshot of a failed job comes back too. Remove only when the gang is certainly over;
    a node that succeeded before the others did leaves it to the sweep, as does an attempt
    that will be restarted (maybe here, maybe elsewhere).
    """
    out_of_restarts = attempt >= max_restarts
    maybe_last = outcome == "succeeded" or cancelled or out_of_restarts
    over = cancelled or (outcome != "succeeded" and out_of_restarts) or (outcome == "succeeded" and all_results)
    return maybe_last, over or aborted


def sweep(where: Path, worker_id: str, busy: set[Path], gang_over: Callable[[str], bool]) -> list[Path]:
    """Remove this worker's gang directories whose gang has ended (``gang_over(gang_id)``); returns them.

    ``where``: this worker's cluster root (``root()``); nothing outside it is looked at, so another
    cluster's directories on the same machine are never touched, whatever its workers are called.
    ``busy``: directories a run on this worker is using now. Kept directories stay. The root itself
    goes once it is empty (``make`` creates it again for the next gang).
    """
    suffix = f"-{_safe(worker_id)}"
    removed = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not (name.startswith(PREFIX) and name.endswith(suffix)) or not entry.is_dir(follow_symlinks=False):
            continue
        base = Path(entry.path)
        if base in busy or (base / "kept").exists():
            continue
        if gang_over(name[len(PREFIX):-len(suffix)]):
            remove(base)
            removed.append(base)
    try:
        where.rmdir()  # only when empty: another worker's directory, or a kept one, keeps it
    except OSError:
        pass
    return removed
