"""The embedded cluster as its users see it: ``up`` / ``down`` (``gpulayer up``), ``start_for_process``
(``gpulayer.init()`` with nothing configured), and ``LocalCluster``.

Each starts the supervisor (``supervisor.py``) in a session of its own and waits for its state file
and its workers.
"""

from __future__ import annotations

import atexit
import os
import select
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..deadline import Deadline
from ..errors import ClusterUnavailable, ConfigError
from ..masking import mask_url
from ..procs.stop import kill_now, stop_process
from ..procs.ready import READY
from ..state_file import STATE_FILE_NAME, home_dir, proc_start_time, read_state
from .leftovers import remove_cluster_root


@dataclass
class LocalCluster:
    """A running embedded cluster, as seen by the process that asked for it."""

    broker_url: str
    secret: str
    home: Path
    supervisor: subprocess.Popen | None = None
    flower_url: str | None = None
    flower_auth: str | None = None  # Flower's login, "user:password" (its pages and API refuse anyone else)

    @property
    def flower_login_url(self) -> str | None:
        """Flower's URL with its login in it (``http://user:password@127.0.0.1:port/``): what curl and a
        browser take as is. Shown masked unless asked (``gpulayer up --show-secrets``)."""
        if not self.flower_url:
            return None
        from .workers import login_url

        return login_url(self.flower_url, self.flower_auth)

    def stop(self, timeout: float = 30.0) -> None:
        if self.supervisor is not None:
            stop_process(self.supervisor, grace=timeout)

    def __repr__(self) -> str:  # the password masked, the secret left out
        return (f"LocalCluster(broker_url={mask_url(self.broker_url)!r}, secret='**********', home={self.home!r}, "
                f"flower_url={self.flower_url!r}, flower_auth={'***' if self.flower_auth else None!r})")


def _spawn_supervisor(home: Path, workers: int, slots: int, parent: int | None, timeout: float,
                      flower: int | None = None, zones: list[str] | None = None,
                      regions: list[str] | None = None, replicas: int = 0, sentinels: int = 0) -> LocalCluster:
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "supervisor.log", "ab")
    ready_r, ready_w = os.pipe()  # the supervisor writes `ready` once its workers registered (supervisor.py)
    args = [sys.executable, "-m", "gpulayer.local", "--home", str(home), "--workers", str(workers),
            "--slots", str(slots), "--ready-fd", str(ready_w)] + (["--parent", str(parent)] if parent else []) \
        + (["--flower", str(flower)] if flower is not None else []) \
        + [a for z in zones or [] for a in ("--zone", z)] + [a for r in regions or [] for a in ("--region", r)] \
        + (["--replicas", str(replicas), "--sentinels", str(sentinels)] if sentinels else [])
    try:
        # Its own session, even for a process-scoped cluster: a Ctrl-C in the terminal is for the script
        # (which may still want to cancel its jobs), not for Redis and the workers; the supervisor
        # follows its parent by itself.
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=(ready_w,))
    finally:
        log.close()
        os.close(ready_w)
    try:
        said = _read_line(ready_r, Deadline(timeout))
    finally:
        os.close(ready_r)
    state = read_state(home / STATE_FILE_NAME) if said == READY else None
    if not state or state.get("supervisor_pid") != proc.pid:
        stop_process(proc)
        tail = (home / "supervisor.log").read_text(errors="replace")[-2000:]
        why = "" if said is not None else f" within {timeout:.0f} s"
        raise ClusterUnavailable(f"the embedded cluster did not start{why} (log {home / 'supervisor.log'}):\n{tail}")
    return LocalCluster(state["broker_url"], state["secret"], home, proc, state.get("flower_url"),
                        state.get("flower_auth"))


def _read_line(fd: int, deadline: Deadline) -> str | None:
    """The first line written to the pipe ``fd`` ("" if its writer exited first), or None once time is up."""
    got = b""
    while b"\n" not in got:
        readable, _, _ = select.select([fd], [], [], deadline.remaining())
        if not readable:
            return None
        chunk = os.read(fd, 512)
        if not chunk:
            return ""
        got += chunk
    return got.split(b"\n", 1)[0].decode()


def default_shape(workers: int | None, slots: int | None) -> tuple[int, int]:
    workers = 2 if workers is None else workers
    slots = max(2, (os.cpu_count() or 2) // max(workers, 1)) if slots is None else slots
    if workers < 1 or slots < 1:
        raise ConfigError(f"--workers and --slots must be at least 1 (got {workers} and {slots})")
    return workers, slots


def up(workers: int | None = None, slots: int | None = None, home: Path | None = None,
       timeout: float = 60.0, flower: int | None = None, zones: list[str] | None = None,
       regions: list[str] | None = None, replicas: int = 0, sentinels: int = 0) -> tuple[LocalCluster, bool]:
    """Start the background cluster, or find the running one. Returns (cluster, started_now).

    ``replicas`` / ``sentinels``: a Sentinel group instead of one Redis (``sentinel_group.py``): a primary,
    ``replicas`` replicas and ``sentinels`` sentinels on loopback; the broker URL is its ``sentinel://`` URL.

    ``flower``: also run Flower on that port (0: a free one); its URL is in the state file.
    ``zones`` / ``regions``: of the workers, in turn (``worker_places``).
    """
    home = home or home_dir()
    state = read_state(home / STATE_FILE_NAME)
    if state and _alive(state.get("supervisor_pid"), state.get("supervisor_start")):
        return LocalCluster(state["broker_url"], state["secret"], home, flower_url=state.get("flower_url"),
                            flower_auth=state.get("flower_auth")), False
    workers, slots = default_shape(workers, slots)
    check_group_shape(replicas, sentinels)
    return _spawn_supervisor(home, workers, slots, parent=None, timeout=timeout, flower=flower, zones=zones,
                             regions=regions, replicas=replicas, sentinels=sentinels), True


def check_group_shape(replicas: int, sentinels: int) -> None:
    """A Sentinel group needs both replicas and sentinels; refuse half of one, saying what to add."""
    if replicas < 0 or sentinels < 0:
        raise ConfigError(f"--replicas and --sentinels cannot be negative (got {replicas} and {sentinels})")
    if replicas and not sentinels:
        raise ConfigError(f"--replicas {replicas} without sentinels: nothing would promote a replica when the primary "
                          "dies; add --sentinels 3")
    if sentinels and not replicas:
        raise ConfigError(f"--sentinels {sentinels} without replicas: there would be no server to promote; add "
                          "--replicas 1")


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
    # Its objects and unpacked code: the next `up` has a new cluster secret, so nothing there would be readable.
    remove_cluster_root(Path(state["machine_root"]) if state.get("machine_root") else None)
    return True


def _alive(pid: int | None, start: str | None) -> bool:
    return bool(pid) and proc_start_time(pid) is not None and proc_start_time(pid) == start


def start_for_process(workers: int | None = None, slots: int | None = None, zones: list[str] | None = None,
                      regions: list[str] | None = None, replicas: int = 0, sentinels: int = 0) -> LocalCluster:
    """An embedded cluster that lives as long as the calling process (``gpulayer.init()``).

    At the process's exit it is stopped at once (``kill_now``: the supervisor and everything below it),
    not gracefully: nothing in it is kept.
    """
    workers, slots = default_shape(workers, slots)
    check_group_shape(replicas, sentinels)
    home = Path(tempfile.mkdtemp(prefix="gpulayer-"))
    cluster = _spawn_supervisor(home, workers, slots, parent=os.getpid(), timeout=60.0, zones=zones,
                                regions=regions, replicas=replicas, sentinels=sentinels)

    # Its Redis ends with it, so its objects and code in the cluster's root on this machine go too (leftovers.py).
    root = (read_state(home / STATE_FILE_NAME) or {}).get("machine_root")

    def _stop():
        # The supervisor would do the same on SIGTERM, but only after waking up; killing its whole tree
        # from here saves that, and the script's exit waits for nothing that needs to end gracefully.
        kill_now([cluster.supervisor])
        shutil.rmtree(home, ignore_errors=True)
        remove_cluster_root(Path(root) if root else None)

    atexit.register(_stop)
    return cluster
