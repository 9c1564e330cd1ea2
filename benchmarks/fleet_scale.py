"""The control plane under an emulated fleet: 1,000, 5,000 and 10,000 workers on one Redis.

For each size, one run starts a Redis on a free loopback port and ``--processes`` emulator
processes (``gpulayer.lab.emulator``) carrying the fleet (8 slots each, 30 zones in 10 regions,
every fifth worker with 8 GPUs), heartbeating once per second. Then, measured:

- ``redis cpu``: Redis's own CPU (``INFO cpu``, user + sys) per second of wall time over
  ``--steady`` seconds of steady state (heartbeats only), and again while jobs flow;
- ``submit``: the latency of ``submit.delay`` (publish; the router's cached snapshot refreshes
  incrementally once a second) for ``--submits`` calls paced over the steady window, p50/p99, and
  the Redis round trips this process made meanwhile per call (redis-py sends, the snapshot's
  background refreshes included);
- ``gang reservations``: the coordinator's step from this process, back to back for 3 s:
  read the slot ledger, place a 2 x 2 gang from the incrementally refreshed snapshot, reserve it
  with ``reserve.lua`` (the slots go back after each, untimed); per second of that work, p50/p99;
- ``ping``: a Redis PING round trip from the same process, the floor under the latencies;
- ``status``: the wall time of ``gpulayer status`` (the summary), ``--json`` and ``--all`` (every
  worker) in a new process, of the imports alone (the floor), and of the summary's read and render in this
  process, first and refreshed (``--status-only`` measures only these); with ``--before DIR`` (a
  checkout of older code, e.g. ``git worktree add /tmp/before <commit>``) the new-process figures
  of that code too, side by side on the same fleet;
- ``connections``: Redis clients per emulator process, and per real worker (``--real-worker``: one
  with 1 slot and one with 4 started into the same cluster, their ``CLIENT LIST`` entries counted
  by their processes' ports, idle);
- ``jobs``: ``--jobs`` emulated jobs (``submit_batch`` of ``emulated(0, i)``) end to end, every
  result checked.

    python benchmarks/fleet_scale.py [--sizes 1000,5000,10000] [--processes 4] [--jobs 20000] [--status-only]
                                     [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import unwind_on_signals, write_results  # same folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpulayer import Resources, submit, submit_batch  # noqa: E402
from gpulayer.lab.emulator import EmulatedFleet  # noqa: E402
from gpulayer.lab.emulator.jobs import REF  # noqa: E402
from gpulayer.models import GangSpec  # noqa: E402
from gpulayer.placement import GangWaiting, place_gang  # noqa: E402
from gpulayer.store.gangs import GangStore  # noqa: E402
from gpulayer.store.registry import FleetView, Registry  # noqa: E402
from gpulayer.lab.fleet import Fleet  # noqa: E402

GOALS = "Redis < 25% of one core in steady state, submit p99 <= 5 ms, gang reservations >= 1,000/s (at 10,000 workers)"


def pct(ms: list[float], q: float) -> float:
    ms = sorted(ms)
    return ms[min(len(ms) - 1, int(len(ms) * q))] if ms else float("nan")


def redis_cpu(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cpu_share(client, seconds: float, during=None) -> float:
    """Redis's CPU seconds per wall second over ``seconds`` (running ``during(deadline)`` meanwhile)."""
    c0, t0 = redis_cpu(client), time.monotonic()
    if during:
        during(t0 + seconds)
    else:
        time.sleep(seconds)
    return (redis_cpu(client) - c0) / (time.monotonic() - t0)


class RoundTrips:
    """Counts redis-py's sends from this process (one per command or pipeline) while ``on``."""

    def __init__(self):
        import redis.connection as rc

        self.count, self.on = 0, False
        original = rc.AbstractConnection.send_packed_command

        def send_packed_command(conn, command, check_health=True):
            self.count += self.on
            return original(conn, command, check_health)

        rc.AbstractConnection.send_packed_command = send_packed_command


ROUND_TRIPS = RoundTrips()


def submit_latencies(count: int, deadline: float) -> list[float]:
    out = []
    ROUND_TRIPS.count, ROUND_TRIPS.on = 0, True
    gap = max(0.0, (deadline - time.monotonic()) / max(1, count))
    for i in range(count):
        t = time.perf_counter()
        submit.delay(REF, 0.0, i)
        out.append((time.perf_counter() - t) * 1e3)
        time.sleep(gap)
    ROUND_TRIPS.on = False
    return out


def ping_latencies(client, count: int) -> list[float]:
    """The floor under every figure here: one Redis round trip from this process, on this machine now."""
    out = []
    for _ in range(count):
        t = time.perf_counter()
        client.ping()
        out.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.01)
    return out


def gang_reservations(client, seconds: float = 3.0) -> tuple[int, float, list[float]]:
    """Reservations back to back: (how many, seconds spent placing and reserving, ms per reservation).

    Each one reads the slot ledger, places from the coordinator's view (refreshed
    incrementally once a second) and reserves with reserve.lua; its slots are given
    back right after, outside the timed part, so the ledger stays as it was.
    """
    store = GangStore(client)
    view = FleetView(Registry(client))
    spec = GangSpec(gang_id="bench", nodes=2, procs_per_node=2)
    lat: list[float] = []
    last_refresh = time.monotonic()
    snapshot = view.refresh()
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t = time.perf_counter()
        if time.monotonic() - last_refresh > 1.0:  # the coordinator's view, refreshed once a second
            snapshot, last_refresh = view.refresh(), time.monotonic()
        gid = f"bench-{len(lat)}"
        try:
            p = place_gang(spec.model_copy(update={"gang_id": gid}), snapshot, store.held())
        except GangWaiting:
            continue
        outcome, _, _ = store.reserve(gid, 0, p, 2)
        lat.append((time.perf_counter() - t) * 1e3)
        if outcome == "ok":
            for w in p.workers:
                store.release(gid, 0, w, 2)
            client.delete(f"gl:gang:{gid}", f"gl:gang:{gid}:0:released")
    return len(lat), sum(lat) / 1e3, lat


def status_time(url: str, secret: str, *args: str, code: str | None = None, tree: Path = ROOT) -> tuple[float, float]:
    """Wall time and CPU time (user + sys) of ``gpulayer status *args`` in a new process (or of
    ``python -c code``), medians of 3, with the gpulayer of ``tree``. On a loaded machine the wall
    time is mostly waiting for a core; the process's own CPU time is what the code costs."""
    env = dict(os.environ, GPULAYER_BROKER_URL=url, GPULAYER_SECRET=secret, PYTHONPATH=str(tree), COLUMNS="120")
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "gpulayer", "status", *args]
    walls, cpus = [], []
    for _ in range(3):
        t = time.perf_counter()
        # cwd: python puts it first on sys.path (-c, -m), ahead of PYTHONPATH
        proc = subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        walls.append(time.perf_counter() - t)
        cpus.append(usage.ru_utime + usage.ru_stime)
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, cmd)
    return statistics.median(walls), statistics.median(cpus)


def status_in_process() -> tuple[float, float]:
    """``gpulayer status``'s read and render in this (connected) process: the first call, then a refresh.

    The first pays the registry's full read; a later one (``--watch``, a metrics scrape) reads only
    what changed since.
    """
    import io

    from rich.console import Console

    from gpulayer import status

    out = []
    for _ in range(2):
        t = time.perf_counter()
        console = Console(file=io.StringIO(), width=120)
        for item in status.renderables(status.collect(None)):
            console.print(item)
        out.append(time.perf_counter() - t)
    return out[0], out[1]


def status_lines(url: str, secret: str, line, before: Path | None = None) -> None:
    def timed(what: str, *args: str, code: str | None = None, note: str = "") -> None:
        now, cpu = status_time(url, secret, *args, code=code)
        if before is None:
            line(f"  {what:<35} {now:.2f} s{note} ({cpu:.2f} s of CPU)")
            return
        then, then_cpu = status_time(url, secret, *args, code=code, tree=before)  # side by side, on the same fleet
        line(f"  {what:<35} {now:.2f} s{note} ({cpu:.2f} s of CPU); before {then:.2f} s ({then_cpu:.2f} s of CPU), "
             f"{then / now:.1f}x wall, {then_cpu / cpu:.1f}x CPU")

    timed("gpulayer status (summary)", note=" in a new process")
    timed("gpulayer status --json (every row)", "--json")
    timed("gpulayer status --all (every row)", "--all")
    timed("python -c 'import gpulayer.cli'", code="import gpulayer.cli", note=" (the floor under a new process)")
    first, again = status_in_process()
    line(f"  status summary in process           {first:.2f} s first (the full read), {again:.2f} s a refresh "
         f"(--watch, a metrics scrape)")


def run_size(n: int, args, out) -> None:
    def line(s=""):
        print(s, flush=True)
        out.append(s)

    with tempfile.TemporaryDirectory() as tmp, Fleet(Path(tmp)) as redis_fleet:
        client = redis_fleet.client()
        fleet = EmulatedFleet(redis_fleet.url, redis_fleet.secret, workers=n, processes=args.processes,
                              log_dir=Path(tmp) / "emu")
        with fleet:
            t0 = time.monotonic()
            fleet.wait_registered(timeout=600)
            line(f"\n{n} emulated workers in {len(fleet.procs)} emulator processes (registered in "
                 f"{time.monotonic() - t0:.1f} s; load average {os.getloadavg()[0]:.1f})")
            redis_fleet.connect()
            if args.status_only:
                time.sleep(args.steady)  # let the registration burst settle, as the full run does before it
                status_lines(redis_fleet.url, redis_fleet.secret, line, args.before)
                client.close()
                return
            submit.delay(REF, 0.0, 0).get(timeout=120)  # warm: routes, connections
            time.sleep(2)  # let the registration burst settle
            steady = cpu_share(client, args.steady)
            lat: list[float] = []
            during = cpu_share(client, args.steady, lambda d: lat.extend(submit_latencies(args.submits, d)))
            line(f"  redis cpu, heartbeats only          {steady * 100:6.1f} % of one core")
            line(f"  redis cpu, with {args.submits / args.steady:.0f} submits/s        {during * 100:6.1f} % of one core")
            line(f"  submit.delay latency                p50 {statistics.median(lat):.2f} ms  p99 {pct(lat, 0.99):.2f} ms "
                 f"({len(lat)} calls; {ROUND_TRIPS.count / len(lat):.2f} Redis round trips per call)")
            ping = ping_latencies(client, 300)
            line(f"  redis PING (the floor)              p50 {statistics.median(ping):.2f} ms  p99 {pct(ping, 0.99):.2f} ms")
            count, secs, glat = gang_reservations(client)
            line(f"  gang reservations (2 x 2)           {count / secs:7.0f} /s  p50 {statistics.median(glat):.2f} ms  "
                 f"p99 {pct(glat, 0.99):.2f} ms (ledger read + place + reserve.lua; {count} in all)")
            status_lines(redis_fleet.url, redis_fleet.secret, line)
            clients = len(client.client_list())
            line(f"  redis connections                   {clients} in all: {clients / len(fleet.procs):.1f} per emulator "
                 f"process ({n / len(fleet.procs):.0f} workers each)")
            if args.real_worker:
                for name, slots in (("real-1", 1), ("real-4", 4)):
                    redis_fleet.add_worker(name, slots=slots, zone="emu-zone-00", region="emu-region-0")
                time.sleep(3)  # every step started
                counts = {name: len(redis_fleet.connections(name)) for name in ("real-1", "real-4")}
                line(f"  connections of one real worker      {counts['real-1']} (slots=1), {counts['real-4']} (slots=4), "
                     f"idle; +1 per pool process once it has stored a result")
                for name in counts:
                    redis_fleet.stop_worker(name)
            t = time.perf_counter()
            hs = submit_batch([submit.s(REF, 0.0, i) for i in range(args.jobs)], resources=Resources())
            published = time.perf_counter() - t
            got = hs.get(timeout=900)
            total = time.perf_counter() - t
            assert got == list(range(args.jobs)), "an emulated job's result is missing or wrong"
            line(f"  {args.jobs} emulated jobs end to end      {total:.1f} s ({args.jobs / total:.0f} jobs/s; published in "
                 f"{published:.1f} s); every result present")
        client.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,5000,10000")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--steady", type=float, default=10.0, help="seconds per CPU window")
    p.add_argument("--submits", type=int, default=500)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--real-worker", action="store_true", help="also start real workers and count their connections")
    p.add_argument("--status-only", action="store_true", help="measure only `gpulayer status` on each size")
    p.add_argument("--before", type=Path, default=None, metavar="DIR",
                   help="a checkout of older code: time its `gpulayer status` too, on the same fleet")
    args = p.parse_args()
    unwind_on_signals()
    out: list[str] = []
    head = (f"fleet_scale.py  {time.strftime('%Y-%m-%d %H:%M:%S')}  python {platform.python_version()}  "
            f"{os.cpu_count()} CPUs  load average {os.getloadavg()[0]:.1f}")
    print(head)
    out.append(head)
    if args.before is not None:
        out.append(f"before = the gpulayer in {args.before}")
    for n in [int(s) for s in args.sizes.split(",")]:
        run_size(n, args, out)
    out.append(f"\ngoals: {GOALS}")
    print(out[-1])
    print("wrote", write_results(out, "fleet_scale_status.txt" if args.status_only else "fleet_scale.txt"))


if __name__ == "__main__":
    main()
