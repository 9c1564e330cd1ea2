"""A project's files as a deterministic, content-addressed tar.

The same files give the same bytes and the same digest on every machine and every run: entries
sorted by path, mtimes, owners and modes normalised, gzip without a timestamp. The digest is the
blake2b of the uncompressed tar, so it names the content, whatever zlib does.

What is left out: version-control and cache directories, hidden directories, virtual environments
(any directory holding ``pyvenv.cfg``), ``site-packages``, compiled files, whatever the root's
``.gitignore`` names (its simple patterns: names, globs, ``dir/``; negations are ignored), and the
caller's ``excludes`` (the same pattern syntax). ``python_only`` keeps the ``*.py`` files of the root and
of its packages (directories with ``__init__.py``) alone: what ``import`` finds beside a script, cheap to
find even when the script sits in a crowded directory (``/tmp``). Otherwise every file goes, a file over
``max_file`` bytes left out and named.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox", ".nox", ".ipynb_checkpoints", "node_modules",
                       "site-packages", "dist-packages", "lightning_logs", "wandb", "mlruns", ".eggs"})
SKIP_SUFFIXES = (".pyc", ".pyo", ".so.tmp", ".swp")
# A checkout of gpulayer itself at the top of a project (a clone one works in) never travels: first on a
# worker's sys.path it would mix with the gpulayer the worker runs.
NEVER = ("/gpulayer/",)
MANIFEST = ".gpulayer-code.json"  # inside the archive: where it was packed from, for a worker's messages
MAX_FILES = 5000
MAX_BYTES = 16 * 2**20  # uncompressed
MAX_FILE = 8 * 2**20  # a single file over this stays behind (datasets, checkpoints), named in ``left_out``
MAX_SEEN = 100_000  # entries looked at before the walk gives up (a root that is a whole disk)


@dataclass(frozen=True)
class Archive:
    """``blob``: the gzipped tar; ``digest``: its content's name (hex); ``files``: the paths in it."""

    digest: str
    blob: bytes
    root: str
    files: tuple[str, ...]
    left_out: tuple[str, ...] = field(default=())


def patterns_of(root: Path) -> list[str]:
    """The simple patterns of ``root/.gitignore`` (none if it has none)."""
    try:
        lines = (root / ".gitignore").read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith(("#", "!"))]


def excluded(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    """Does a gitignore-style pattern leave ``rel`` (a path relative to the root, with ``/``) out?"""
    name = rel.rsplit("/", 1)[-1]
    for pat in patterns:
        dir_only = pat.endswith("/")
        pat = pat.rstrip("/")
        if not pat or (dir_only and not is_dir):
            continue
        if "/" in pat:  # anchored at the root
            if fnmatch.fnmatchcase(rel, pat.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, pat):
            return True
    return False


def _skipped_dir(path: Path, name: str) -> bool:
    return name in SKIP_DIRS or name.startswith(".") or (path / "pyvenv.cfg").exists()


def collect(root: Path, *, python_only: bool, excludes: list[str] = (), max_file: int = MAX_FILE,
            max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> tuple[list[tuple[str, Path]], list[str]]:
    """The ``(path in the archive, file)`` pairs of ``root``, sorted, and the files left out for their size."""
    patterns = patterns_of(root) + list(excludes) + list(NEVER)
    found: list[tuple[str, Path]] = []
    left_out: list[str] = []
    total = seen = 0
    for dirpath, dirs, names in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = sorted(d for d in dirs if not _skipped_dir(here / d, d)
                         and not excluded(prefix + d, True, patterns)
                         and (not python_only or (here / d / "__init__.py").is_file()))
        seen += len(names) + len(dirs)
        if seen > MAX_SEEN:
            raise ConfigError(f"{root} holds over {MAX_SEEN:,} files and directories: it is not a project directory; "
                         "pass working_dir= the project's own directory, or excludes= what is not code")
        for name in sorted(names):
            rel = prefix + name
            if name.endswith(SKIP_SUFFIXES) or (python_only and not name.endswith(".py")) \
                    or excluded(rel, False, patterns):
                continue
            path = here / name
            if path.is_symlink() or not path.is_file():
                continue
            size = path.stat().st_size
            if size > max_file:
                left_out.append(f"{rel} ({size / 2**20:.1f} MiB)")
                continue
            found.append((rel, path))
            total += size
            if len(found) > max_files or total > max_bytes:
                raise ConfigError(f"{root} holds over {min(len(found), max_files):,} files / "
                             f"{total / 2**20:.1f} MiB to ship (limits {max_files:,} files, "
                             f"{max_bytes / 2**20:.0f} MiB); pass excludes= for data and outputs, or working_dir= "
                             "the directory of the code alone")
    return sorted(found), left_out


def module_files(name: str) -> list[tuple[str, Path]]:
    """The files of the importable module or package ``name`` (or a path to one), as archive entries at the top."""
    path = Path(name)
    if not path.exists():
        import importlib.util

        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as err:
            raise ConfigError(f"py_modules: cannot find module {name!r} ({err})") from err
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            raise ConfigError(f"py_modules: no module {name!r} with source here; give its name as imported "
                              "or a path to its file or package directory")
        path = Path(spec.origin)
        if path.name == "__init__.py":
            path = path.parent
    path = path.resolve()
    if path.is_file():
        return [(path.name, path)]
    out = []
    for rel, file in collect(path, python_only=False)[0]:
        out.append((f"{path.name}/{rel}", file))
    return out


def build(root: Path | None, *, py_modules: list[str] = (), excludes: list[str] = (), python_only: bool = False,
          max_file: int = MAX_FILE, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> Archive:
    """The archive of ``root`` (None: none) and of ``py_modules`` (placed at its top, beside the root's files)."""
    entries: dict[str, Path] = {}
    left_out: list[str] = []
    if root is not None:
        found, left_out = collect(root, python_only=python_only, excludes=list(excludes), max_file=max_file,
                                  max_files=max_files, max_bytes=max_bytes)
        entries.update(found)
    for name in py_modules:
        entries.update(module_files(str(name)))
    manifest = json.dumps({"root": str(root) if root is not None else None,
                           "py_modules": [str(m) for m in py_modules]}, sort_keys=True).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, manifest, 0o644)
        for rel in sorted(entries):
            path = entries[rel]
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            _add(tar, rel, path.read_bytes(), mode)
    data = raw.getvalue()
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=5, mtime=0) as gz:
        gz.write(data)
    return Archive(digest, packed.getvalue(), str(root) if root is not None else "", tuple(sorted(entries)),
                   tuple(left_out))


def digest_of(blob: bytes) -> str:
    """The digest ``build`` gives the gzipped tar ``blob``: its uncompressed content's."""
    return hashlib.blake2b(gzip.decompress(blob), digest_size=16).hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def unpack(blob: bytes, dest: Path) -> None:
    """Extract an archive made by ``build`` into ``dest`` (regular files only, nothing outside it)."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")


def manifest(where: Path) -> dict:
    """The manifest of an unpacked archive: ``root`` and ``py_modules`` as the client packed them."""
    try:
        return json.loads((where / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
