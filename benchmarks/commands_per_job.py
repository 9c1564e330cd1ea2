"""Redis commands per tiny job, by who sends them: the worker's main process, its pool processes, the client.

    python benchmarks/commands_per_job.py [--jobs 500] [--workers 1] [--slots 1] [--way batch|delay]

One Redis (free loopback port) and real workers. A MONITOR connection watches every command while
``--jobs`` jobs run (``submit_batch`` or one ``submit.delay`` each) and their results are read; each
command is charged to the process whose socket sent it (``psutil`` maps the client port to a process).
Commands a Lua script runs count apart (``lua``): they cost no round trip. The idle rate (heartbeats,
janitor, the idle take's 1 s wait) is measured beforehand over the same time and printed beside it.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from common import write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.lab.fleet import Fleet  # noqa: E402

LINE = re.compile(r'^[\d.]+ \[\d+ (?P<addr>[^\]]+)\] "(?P<cmd>[^"]+)"')


def square(x):
    return x * x


class Monitor(threading.Thread):
    """Every command Redis runs while started: (client address, command name)."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client  # keeps its pool (and so the connection) alive
        self.conn = client.connection_pool.get_connection()
        self.conn.send_command("MONITOR")
        self.conn.read_response()
        self.seen: list[tuple[str, str]] = []
        self.stopping = False

    def run(self) -> None:
        while not self.stopping:  # a daemon thread: a blocking read (a read timeout would drop the connection)
            try:
                line = self.conn.read_response()
            except Exception as err:
                print("monitor stopped:", err, file=sys.stderr)
                return
            m = LINE.match(line if isinstance(line, str) else line.decode(errors="replace"))
            if m:
                self.seen.append((m["addr"], m["cmd"].upper()))

    def take(self) -> list[tuple[str, str]]:
        out, self.seen = self.seen, []
        return out


def owners(fleet: Fleet) -> dict[int, str]:
    """Local port -> "worker main" / "worker pool" / "client", for every socket to Redis."""
    out = {}
    for proc in fleet.workers.values():
        main = psutil.Process(proc.pid)
        for who, p in [("worker main", main)] + [("worker pool", c) for c in main.children(recursive=True)]:
            for c in p.net_connections(kind="tcp"):
                if c.raddr and c.raddr.port == fleet.port:
                    out[c.laddr.port] = who
    for c in psutil.Process(os.getpid()).net_connections(kind="tcp"):
        if c.raddr and c.raddr.port == fleet.port:
            out[c.laddr.port] = "client"
    return out


def tally(seen, ports) -> dict[str, collections.Counter]:
    by: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for addr, cmd in seen:
        if addr == "lua":
            by["lua"][cmd] += 1
            continue
        port = int(addr.rsplit(":", 1)[1])
        by[ports.get(port, "other")][cmd] += 1
    return by


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--way", choices=("batch", "delay"), default="batch")
    args = p.parse_args(argv)
    lines: list[str] = []

    def out(s=""):
        print(s, flush=True)
        lines.append(s)

    out(f"# commands_per_job.py  jobs {args.jobs} ({args.way}), {args.workers} worker(s) x {args.slots} slot(s)  "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with Fleet(Path(tempfile.mkdtemp(prefix="gl-cmds-")), appendonly=False) as fleet:
        for i in range(args.workers):
            fleet.add_worker(f"cmd-{i + 1}", slots=args.slots, wait=False, tie_to_parent=True)
        fleet.wait_workers(list(fleet.workers))
        fleet.connect()
        from gpulayer import submit, submit_batch

        submit_batch([submit.s(square, i) for i in range(20)]).get(timeout=60)  # warm-up
        mon = Monitor(fleet.client())
        mon.start()
        t0 = time.perf_counter()
        if args.way == "batch":
            results = submit_batch([submit.s(square, i) for i in range(args.jobs)]).get(timeout=300)
        else:
            results = [h.get(timeout=300) for h in [submit.delay(square, i) for i in range(args.jobs)]]
        took = time.perf_counter() - t0
        assert results == [i * i for i in range(args.jobs)]
        time.sleep(0.3)
        busy = mon.take()
        time.sleep(took)
        idle = mon.take()
        mon.stopping = True
        ports = owners(fleet)
    b, i = tally(busy, ports), tally(idle, ports)
    out(f"# {args.jobs} jobs in {took:.2f} s; idle measured over the same time afterwards")
    out(f"{'who':<12} {'per job':>8} {'idle/job':>9}  commands per job (busy run)")
    for who in ("worker main", "worker pool", "lua", "client", "other"):
        n, k = sum(b[who].values()), sum(i[who].values())
        top = ", ".join(f"{c} {v / args.jobs:.2f}" for c, v in b[who].most_common(12))
        out(f"{who:<12} {n / args.jobs:>8.2f} {k / args.jobs:>9.2f}  {top}")
    worker = sum(sum(b[w].values()) - sum(i[w].values()) for w in ("worker main", "worker pool")) / args.jobs
    out(f"worker round-trip commands per job, idle subtracted: {worker:.2f}")
    print(f"\nwritten to {write_results(lines, f'commands_per_job-{args.way}.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
