"""Client side of shipping the user's code: which code a job carries, built once, uploaded once per digest.

A job carries one header, ``gl_code``: the digest of its code's archive (``archive.py``), which waits in
Redis under ``keys.code_archive(digest)``, signed. What is shipped, in order of precedence:

- the call's own ``working_dir=`` / ``py_modules=`` / ``excludes=`` (``.set(...)``, ``apply_async``,
  ``submit_batch``, ``distributed``);
- inside a job or a rank, the code of the job that runs (a chain's next step, a job's own jobs);
- ``gpulayer.init(working_dir=..., py_modules=..., excludes=...)``;
- by default, the ``*.py`` files of the script's directory and of its packages (``roots.script_root``);
  too large a directory is not shipped, with one warning that says how to choose.

``working_dir=False`` ships no directory. An explicit ``working_dir`` ships every file of it that is
not excluded (data files a module reads beside itself too). Each distinct choice is packed once per
process: files changed after a process packed them are not seen by the workers until it starts again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from .. import signing
from ..errors import ConfigError
from ..store import keys
from ..procs import runtime
from . import archive, roots

CODE_HEADER = "gl_code"  # a job's message header: the digest of the code it runs with
CODE_ENV = "GPULAYER_CODE"  # a rank's environment: the same, for its process (and the jobs it sends)
OPTIONS = ("working_dir", "py_modules", "excludes", "runtime_env")  # per-call options (submit, submit_batch, ...)

log = logging.getLogger(__name__)
AUTO = "auto"


class CodeSpec(NamedTuple):
    """What to ship: ``working_dir`` (a path, ``AUTO``: the script's directory, python files only, or None:
    none), ``py_modules`` (names or paths), ``excludes`` (gitignore-style patterns)."""

    working_dir: str | None = AUTO
    py_modules: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()


_default = CodeSpec()
_built: dict[CodeSpec, archive.Archive | None] = {}
# (signer, digest) -> when this process last put it in (or renewed it in) the Redis it uses; the signer is the
# token's user (None: the cluster secret), as each user's archive is signed by that user
_last_put: dict[tuple[str | None, str], float] = {}
RENEW_EVERY = keys.CODE_TTL / 4  # a client that keeps using an archive renews its expiry this often
_lock = threading.Lock()
_warned: set[str] = set()


def spec_of(working_dir=None, py_modules: Sequence[str] | None = None,
            excludes: Sequence[str] | None = None, base: CodeSpec | None = None,
            runtime_env: dict | None = None) -> CodeSpec:
    """A ``CodeSpec`` from the user's arguments, over ``base``; ``working_dir=False`` ships no directory.

    ``runtime_env``: Ray's spelling of the same three (``{"working_dir": ".", "py_modules": [...],
    "excludes": [...]}``); any other key of it is refused, naming what to do instead.
    """
    if runtime_env is not None:
        working_dir, py_modules, excludes = _from_runtime_env(runtime_env, working_dir, py_modules, excludes)
    base = base or _default
    if working_dir is None:
        wd = base.working_dir
    elif working_dir is False:
        wd = None
    elif isinstance(working_dir, (str, os.PathLike)):
        path = Path(working_dir).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(f"working_dir={str(working_dir)!r}: {path} is not a directory")
        wd = str(path)
    else:
        raise TypeError(f"working_dir must be a path or False, got {type(working_dir).__name__}")
    if isinstance(py_modules, (str, os.PathLike)):
        raise TypeError("py_modules takes a list of module names or paths, e.g. py_modules=['mylib']")
    if isinstance(excludes, (str, os.PathLike)):
        raise TypeError("excludes takes a list of patterns, e.g. excludes=['data/', '*.ckpt']")
    mods = base.py_modules if py_modules is None else tuple(_module_name(m) for m in py_modules)
    excl = base.excludes if excludes is None else tuple(str(e) for e in excludes)
    return CodeSpec(wd, mods, excl)


def _from_runtime_env(env, working_dir, py_modules, excludes):
    from ..errors import UnsupportedOption

    if not isinstance(env, dict):
        raise TypeError(f"runtime_env must be a dict, got {type(env).__name__}")
    other = sorted(set(env) - {"working_dir", "py_modules", "excludes"})
    if other:
        raise UnsupportedOption(f"runtime_env={{{', '.join(repr(k) for k in other)}: ...}} is not supported: gpulayer "
                                "ships working_dir, py_modules and excludes only; install packages (pip, conda) on "
                                "the workers, and set environment variables in the function or on the workers")
    return (env.get("working_dir", working_dir), env.get("py_modules", py_modules), env.get("excludes", excludes))


def _module_name(module) -> str:
    name = getattr(module, "__name__", None) if not isinstance(module, (str, os.PathLike)) else None
    if name is not None:  # a module object: its package directory or file
        path = getattr(module, "__file__", None)
        if path is None:
            raise ConfigError(f"py_modules: module {name!r} has no source file to ship")
        path = Path(path)
        return str(path.parent if path.name == "__init__.py" else path)
    text = str(module)
    return str(Path(text).resolve()) if os.sep in text or text.endswith(".py") else text


def configure(working_dir=None, py_modules=None, excludes=None, runtime_env=None) -> None:
    """This process's default (``gpulayer.init(working_dir=..., py_modules=..., excludes=...)``)."""
    global _default
    if working_dir is None and py_modules is None and excludes is None and runtime_env is None:
        return
    _default = spec_of(working_dir, py_modules, excludes, CodeSpec(), runtime_env)


def inherited() -> str | None:
    """The code of the job or rank this process runs now, if any (its jobs run with it too): the digest, ""
    in a worker outside a job that carries code (a worker ships nothing of its own), None in a client."""
    global _env_code
    if _env_code is None:
        _env_code = os.environ.get(CODE_ENV, "")  # a rank's, set by its agent before it started
    if _env_code:
        return _env_code
    if runtime.current_worker() is None:
        return None
    from ..app import app

    task = app.current_worker_task
    return (task.request.get(CODE_HEADER) or "") if task is not None else ""


_env_code: str | None = None


def build(spec: CodeSpec) -> archive.Archive | None:
    """The archive of ``spec``, packed once per process; None when there is nothing to ship."""
    with _lock:
        if spec in _built:
            return _built[spec]
    auto = spec.working_dir == AUTO
    root = roots.script_root() if auto else (Path(spec.working_dir) if spec.working_dir else None)
    if root is None and not spec.py_modules:
        found = None
    else:
        try:
            found = archive.build(root, py_modules=list(spec.py_modules), excludes=list(spec.excludes),
                                  python_only=auto)
        except ConfigError as err:
            if not auto:
                raise
            _warn_once(str(root), f"gpulayer: the script's directory is not shipped to the workers: {err}; "
                                  "pass gpulayer.init(working_dir=..., excludes=[...]) or working_dir=False")
            found = None
        if found is not None and not found.files:
            found = None  # nothing of the user's: no header, no upload
    with _lock:
        _built[spec] = found
    if found is not None and found.left_out:
        _warn_once(found.digest, f"gpulayer: left out of the shipped code (too large): {', '.join(found.left_out)}")
    return found


def _warn_once(key: str, text: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(text)  # on stderr unless logging is configured (Python's last-resort handler)


def upload(client, found: archive.Archive) -> str:
    """Put ``found`` in the cluster's Redis, or renew its expiry there if it is there already; its digest."""
    name = keys.code_archive(found.digest)
    pipe = client.pipeline(transaction=False)
    # On a cluster with users, the archive goes in signed by this user even if another user's copy of the same
    # content is there: workers check the signer, and that other user's token may be revoked.
    pipe.set(name, signing.sign(found.blob), ex=keys.CODE_TTL, nx=signing.current_user() is None)
    pipe.expire(name, keys.CODE_TTL)  # one that was there already lives on from now
    pipe.execute()
    _last_put[(signing.current_user(), found.digest)] = time.monotonic()
    return found.digest


def digest_for(redis_client: Callable[[], object], options: dict | None = None) -> str | None:
    """The code a job sent now carries (its ``gl_code`` header), uploaded; None: it carries none.

    ``options``: the call's own; its ``working_dir`` / ``py_modules`` / ``excludes`` are taken out of it.
    ``redis_client()``: the cluster's Redis. Once its archive is up, a call costs a few dictionary look-ups
    and a clock read (no round trip, no file read, not even the client's look-up).
    """
    if options and (OPTIONS[0] in options or OPTIONS[1] in options or OPTIONS[2] in options
                    or OPTIONS[3] in options):
        spec = spec_of(**{k: options.pop(k) for k in OPTIONS if k in options})
    else:
        parent = inherited()
        if parent is not None:
            return parent or None
        spec = _default
    found = _built.get(spec, _UNBUILT)
    if found is _UNBUILT:
        found = build(spec)
    if found is None:
        return None
    if time.monotonic() - _last_put.get((signing.current_user(), found.digest), -RENEW_EVERY) < RENEW_EVERY:
        return found.digest  # put in this cluster's Redis (or renewed) by this process lately
    return upload(redis_client(), found)


_UNBUILT = object()


def connected() -> None:
    """This process now talks to a (maybe other) cluster: each archive is put in its Redis again when next used."""
    _last_put.clear()


def reset() -> None:
    """Forget this process's default, packed archives and uploads (for tests)."""
    global _default
    with _lock:
        _default = CodeSpec()
        _built.clear()
        _last_put.clear()
        _warned.clear()
