"""The supervisor: one process that owns the embedded cluster's Redis, workers and Flower.

It starts Redis bound to 127.0.0.1 on a free port with a generated password and append-only
persistence, then the workers (in the zones of ``places.worker_places``); it writes the state file
(mode 0600), starts again a worker that dies, and, when told to stop (SIGTERM, or its parent process
exits for a process-scoped cluster), stops exactly the processes it started: gracefully for
``gpulayer up``, at once for a process-scoped cluster. ``python -m gpulayer.local`` runs it.

A Redis that dies is started again at once, on the same port with the same password, from its own
append-only file: the workers and clients reconnect by themselves and nothing Redis acknowledged is lost.
Each restart is counted in the state file and in Redis (``keys.LOCAL_REDIS``, which ``gpulayer status``
shows). A Redis that dies ``RESTART_LIMIT`` times within ``RESTART_WINDOW`` seconds is not started again:
the cluster stops, and ``stopped.json`` in its home says why (``gpulayer status``, ``gpulayer up`` and the
clients' ``ClusterUnavailable`` quote it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import ClusterUnavailable
from ..procs.env import free_port
from ..procs.stop import kill_now, stop, stop_process
from ..store import keys
from ..procs.ready import CONSUMING, READY
from ..state_file import STATE_FILE_NAME, proc_start_time, read_state, write_state  # noqa: F401
from .events import Events
from .places import worker_places
from .redis_server import start_redis, wait_for_redis
from .workers import flower_hears, new_flower_login, start_flower, start_worker, wait_for_port, wait_ready


STOPPED_FILE_NAME = "stopped.json"  # in the cluster's home: why the supervisor stopped on its own, for its users
RESTART_LIMIT = 5  # deaths of Redis ...
RESTART_WINDOW = 60.0  # ... within this many seconds, and the supervisor stops instead of restarting it again


def restart_after(down_after_ms: int) -> float:
    """Seconds a dead server of the embedded Sentinel group waits before it is started again: a few down-afters,
    so a failover can be seen."""
    return 5 * down_after_ms / 1000


class RedisDeaths:
    """The embedded Redis's deaths: when each was, and whether one more restart is allowed."""

    def __init__(self, limit: int = RESTART_LIMIT, window: float = RESTART_WINDOW):
        self.limit, self.window = limit, window
        self.recent: list[float] = []  # monotonic times of the deaths within the window
        self.count = 0  # restarts so far
        self.last: dict | None = None  # {"exit": code, "at": wall time} of the last death

    def died(self, code: int | None) -> bool:
        """Record a death; True when Redis may be started again, False once it died ``limit`` times in the window."""
        now = time.monotonic()
        self.recent = [t for t in self.recent if now - t < self.window] + [now]
        self.last = {"exit": code, "at": time.time()}
        if len(self.recent) >= self.limit:
            return False
        self.count += 1
        return True

    def record(self) -> dict:
        """What the state file and Redis keep: ``{"restarts": n, "last_exit": code, "last_at": time}``."""
        last = self.last or {}
        return {"restarts": self.count, "last_exit": last.get("exit"), "last_at": last.get("at")}


def describe_restarts(record: dict) -> str | None:
    """``restarted 1 time (last: exited -9 at 19:40:02)``, from :meth:`RedisDeaths.record`; None for none."""
    n = int(record.get("restarts") or 0)
    if not n:
        return None
    at = record.get("last_at")
    when = f" at {time.strftime('%H:%M:%S', time.localtime(float(at)))}" if at else ""
    return f"restarted {n} time{'s' if n != 1 else ''} (last: exited {record.get('last_exit')}{when})"


def stopped_note(home: Path, fix: bool = True) -> str | None:
    """Why the embedded cluster of ``home`` stopped on its own (``stopped.json``), in one line; None if it did not.

    ``fix``: say also where to look and how to start it again.
    """
    try:
        info = json.loads((home / STOPPED_FILE_NAME).read_text())
    except (OSError, ValueError):
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("at", 0)))
    note = f"the embedded cluster stopped at {when}: {info.get('reason')}"
    return note + (f"; see {info.get('log')}, then start it again (`gpulayer up`, or gpulayer.init() in a new "
                   "process)" if fix else "")


def record_group(state_file: Path, state: dict, group) -> None:
    """The Sentinel group's processes in the state file (``gpulayer up`` prints them: kill one to watch)."""
    state["sentinel_group"] = {"pids": group.pids(), "down_after_ms": group.down_after_ms,
                               "failover_timeout_ms": group.failover_timeout_ms}
    write_state(state_file, state)


def _publish_restarts(url: str, deaths: RedisDeaths) -> None:
    """Tell the cluster's Redis how often it was restarted (``gpulayer status`` reads it); best effort."""
    from ..store.connection import connect_redis  # (the supervisor's imports stay light: `gpulayer up` waits on them)

    client = connect_redis(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.hset(keys.LOCAL_REDIS, mapping={k: json.dumps(v) for k, v in deaths.record().items()})
    except Exception as err:  # noqa: BLE001  (Redis died again: the loop sees it)
        print(f"could not record the restart in Redis: {err}", file=sys.stderr)
    finally:
        client.close()


GROUP_TURN = 0.5  # seconds between a Sentinel group's turns of tending (restarting a dead server)


def supervise(home: Path, workers: int, slots: int, parent: int | None, flower_port: int | None = None,
              zones: list[str] | None = None, regions: list[str] | None = None, replicas: int = 0,
              sentinels: int = 0, ready_fd: int | None = None) -> int:
    """Run the cluster until told to stop (or, with ``parent``, until that process exits).

    ``replicas`` and ``sentinels``: a Sentinel group (``sentinel_group.py``) instead of one Redis; the broker
    URL is then the group's ``sentinel://`` URL. ``ready_fd``: a pipe to whoever started this supervisor; it
    gets the line ``ready`` once the state file is written and every worker is in the registry (``cluster.py``
    waits on it), then is closed.
    """
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    logs = home / "logs"
    logs.mkdir(exist_ok=True)
    state_file = home / STATE_FILE_NAME
    password = secrets.token_urlsafe(24)
    secret = secrets.token_urlsafe(32)
    port = free_port()
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    group = None
    root = None  # a process-scoped cluster's root on this machine, once its Redis answers
    if sentinels:  # a dead server waits a few down-afters before it is started again, so a failover can be seen
        from .sentinel_group import SentinelGroup

        group = SentinelGroup(home / "group", password, replicas=replicas, sentinels=sentinels, tie_to_parent=True)
        group.restart_after = restart_after(group.down_after_ms)
    stopping = False

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    (home / STOPPED_FILE_NAME).unlink(missing_ok=True)  # an earlier cluster's account of its end

    def start_redis_here():  # the same port, password and data (its append-only file) every time
        return start_redis(home / "redis", port=port, password=password, log_file=logs / "redis.log",
                           tie_to_parent=True)

    if group is not None:
        group.start()
        url, redis_proc = group.url, group.procs[group.server_ports[0]]
    else:
        redis_proc = start_redis_here()
    deaths = RedisDeaths()
    gave_up = False
    procs: dict[str, subprocess.Popen] = {}
    flower: subprocess.Popen | None = None
    places = dict(zip([f"local-{i + 1}" for i in range(workers)], worker_places(workers, zones, regions)))

    flower_auth = new_flower_login() if flower_port is not None else None
    # With a Flower, workers send events from their start (Flower would turn them on seconds later), so it
    # lists every job from the first one.
    worker_env = dict(os.environ, GPULAYER_EVENTS="1") if flower_port is not None else None

    def start(name: str, ready: int | None = None) -> subprocess.Popen:
        zone, region = places[name]
        proc = start_worker(url, secret, name=name, slots=slots, zone=zone, region=region,
                            log_file=logs / f"{name}.log", tie_to_parent=True, ready=ready, env=worker_env)
        events.watch(proc.pid)
        return proc

    events = Events()  # wakes the loop below on a signal or a child's exit
    try:
        if parent is not None and not events.watch(parent):
            return 0  # the process this cluster is for is gone already
        if group is None:
            wait_for_redis(url, redis_proc)
            events.watch(redis_proc.pid)
        pipes = {}
        for name in places:
            read, write = os.pipe()
            procs[name] = start(name, ready=write)
            os.close(write)
            pipes[name] = read
        flower_url = None
        if flower_port is not None:
            flower_port = flower_port or free_port()
            flower = start_flower(url, secret, port=flower_port, log_file=logs / "flower.log", tie_to_parent=True,
                                  basic_auth=flower_auth)
            if wait_for_port(flower_port, flower):
                flower_url = f"http://127.0.0.1:{flower_port}/"
            else:
                print(f"Flower did not start on port {flower_port}; see {logs / 'flower.log'}", file=sys.stderr)
        # Each worker says when it hears its own control cast through the broker (worker/starting.py), before it
        # imports torch: it takes jobs, and `celery inspect` and app.control hear it, so the cluster is ready.
        missing = wait_ready(pipes, CONSUMING, READY_TIMEOUT)
        if missing:  # the cluster does not start half-way: everything stops, and the starter quotes this log
            print(f"worker{'s' if len(missing) > 1 else ''} {', '.join(missing)} did not answer within "
                  f"{READY_TIMEOUT:.0f} s or exited; see {', '.join(str(logs / f'{n}.log') for n in missing)}",
                  file=sys.stderr)
            return 1
        # `up --flower` returns once Flower listens to the workers' events: a job sent then is listed.
        if flower_url and not flower_hears(flower_url, flower_auth, list(places), flower):
            print(f"Flower did not hear every worker within 30 s; jobs sent now may be missing from it; "
                  f"see {logs / 'flower.log'}", file=sys.stderr)
        # What its processes keep in the cluster's root on this machine (objects, code) goes when it ends
        # (leftovers.py): a process-scoped one's Redis ends with it; after `gpulayer down`, the next `up` has a
        # new secret, which reads none of the objects signed with this one.
        root = _cluster_root(url)
        state = {"broker_url": url, "secret": secret, "home": str(home), "supervisor_pid": os.getpid(),
                 "supervisor_start": proc_start_time(os.getpid()), "redis_pid": redis_proc.pid,
                 "worker_pids": {n: p.pid for n, p in procs.items()}, "workers": workers, "slots": slots,
                 "places": {n: {"zone": z, "region": r} for n, (z, r) in places.items()},
                 "started_at": time.time(), "flower_url": flower_url,
                 "flower_pid": flower.pid if flower_url else None, "flower_auth": flower_auth if flower_url else None,
                 "redis": deaths.record(), "machine_root": str(root) if root else None}
        write_state(state_file, state)
        if group is not None:
            record_group(state_file, state, group)
        if ready_fd is not None:
            _tell_ready(ready_fd)
        while not stopping:
            events.wait(GROUP_TURN if group is not None else None)  # a group's servers: tended every turn
            if stopping:
                break
            if parent is not None and os.getppid() != parent:
                break  # the process this cluster belongs to is gone
            if group is not None:
                for line in group.tend():
                    print(line, file=sys.stderr)
                    record_group(state_file, state, group)
            elif redis_proc.poll() is not None and not stopping:
                code = redis_proc.returncode
                if not deaths.died(code):
                    reason = (f"its Redis died {deaths.limit} times within {deaths.window:.0f} s (last: exited "
                              f"{code}), so it was not started again")
                    print(f"redis-server exited with {code}; {reason}; stopping", file=sys.stderr)
                    write_state(home / STOPPED_FILE_NAME,
                                {"at": time.time(), "reason": reason, "log": str(logs / "redis.log")})
                    gave_up = True
                    break
                print(f"redis-server exited with {code}; starting it again from its append-only file "
                      f"(restart {deaths.count})", file=sys.stderr)
                events.forget(redis_proc.pid)
                redis_proc = start_redis_here()
                events.watch(redis_proc.pid)
                state.update(redis_pid=redis_proc.pid, redis=deaths.record())
                write_state(state_file, state)
                try:
                    wait_for_redis(url, redis_proc, timeout=30.0)
                except ClusterUnavailable as err:
                    print(f"the restarted redis-server did not answer: {err}", file=sys.stderr)
                    continue  # an exit is counted on the next turn
                _publish_restarts(url, deaths)
            for name, proc in procs.items():
                if proc.poll() is not None and not stopping:
                    # Keep the fleet whole: a local worker that dies is started again.
                    print(f"worker {name} exited with {proc.returncode}; restarting", file=sys.stderr)
                    events.forget(proc.pid)
                    procs[name] = start(name)
    finally:
        events.close()
        if ready_fd is not None:
            _close(ready_fd)  # a supervisor that failed before it was ready: its starter reads the end of file
        if parent is not None:
            # A process-scoped cluster: everything at once, nothing to keep (the script has ended).
            kill_now([flower, *procs.values(), *([] if group else [redis_proc])])
            if group is not None:
                group.stop(graceful=False)
        else:
            # `gpulayer up`: Flower and the workers at once (the workers finish and hand back what they hold),
            # then Redis, which writes its file.
            stop([p for p in (flower, *procs.values()) if p is not None], grace=10)
            if group is not None:
                group.stop()
            else:
                stop_process(redis_proc, grace=10)
        state = read_state(state_file)
        if state and state.get("supervisor_pid") == os.getpid():
            state_file.unlink(missing_ok=True)
        # A process-scoped cluster leaves nothing behind, except after giving up: stopped.json then stays for
        # its script to quote (the script's own exit removes the home).
        if parent is not None and not gave_up:
            shutil.rmtree(home, ignore_errors=True)
        if root is not None and parent is not None:  # (`gpulayer down` removes an `up` cluster's, once it is gone)
            from .leftovers import remove_cluster_root

            remove_cluster_root(root)
        # Nothing is left to free: the interpreter's last collection (over Redis's client) would only delay the
        # exit that `gpulayer down` waits for (as session.py does for a client).
        gc.freeze()
    return 0


def _cluster_root(url: str) -> Path | None:
    """This cluster's root on this machine; its id is made now if no worker made it yet (``store/cluster.py``)."""
    from ..store.cluster import cluster_id, machine_root
    from ..store.connection import connect_redis

    client = connect_redis(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        return machine_root(cluster_id(client))
    except Exception as err:  # noqa: BLE001  (a cluster without the cleanup still runs)
        print(f"could not read the cluster id ({err}); its objects will stay in {tempfile.gettempdir()}",
              file=sys.stderr)
        return None
    finally:
        client.close()


READY_TIMEOUT = 120.0  # seconds the workers may take to register (a loaded machine importing Celery)


def _tell_ready(fd: int) -> None:
    try:
        os.write(fd, f"{READY}\n".encode())
    except OSError:  # whoever started us stopped waiting
        pass


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulayer.local", description="embedded cluster supervisor")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--parent", type=int, default=None)
    p.add_argument("--flower", type=int, default=None, help="run Flower on this port (0: a free one)")
    p.add_argument("--zone", action="append", default=None, help="zone of the next worker (repeatable)")
    p.add_argument("--region", action="append", default=None, help="region of the next worker (repeatable)")
    p.add_argument("--replicas", type=int, default=0, help="replicas of a Sentinel group (with --sentinels)")
    p.add_argument("--sentinels", type=int, default=0, help="sentinels of a Sentinel group (with --replicas)")
    p.add_argument("--ready-fd", type=int, default=None, help="a pipe to tell `ready` once the workers registered")
    a = p.parse_args(argv)
    return supervise(a.home, a.workers, a.slots, a.parent, a.flower, a.zone, a.region, a.replicas, a.sentinels,
                     a.ready_fd)
