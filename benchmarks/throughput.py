"""Throughput of tiny jobs: gpulayer (``submit_batch``, ``submit.delay``) against plain Celery (``.delay``).

One run starts one Redis on a free loopback port, then both sides' workers:

- plain Celery: a Celery app defined in this file, JSON serializer, default
  settings except the result backend (the same Redis), one worker with the
  prefork pool and ``--concurrency`` = the gpulayer side's total slots, on its
  own queue. The worker is this script run with ``--plain-worker``.
- gpulayer: ``--workers`` ``gpulayer worker`` processes with ``--slots`` each.

Each round times three ways of running ``--jobs`` calls of ``square(i)``:

- ``plain delay``:   one ``square.delay(i)`` per job, then ``r.get()`` on each handle;
- ``gpulayer batch``: ``submit_batch([submit.s(square, i) ...])`` then ``.get()``;
- ``gpulayer delay``: one ``submit.delay(square, i)`` per job, then ``h.get()`` on each.

``submit`` is the time until every publish call returned; ``end-to-end`` is from
the first publish to every result in hand; jobs/s = jobs / end-to-end. Rounds
rotate the order of the three; the medians are quoted.

    python benchmarks/throughput.py [--jobs 2000] [--rounds 5] [--workers 2] [--slots 1]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import unwind_on_signals, write_results  # same folder

from celery import Celery

PLAIN_QUEUE = "bench.plain"
WORKER_READY_TIMEOUT = 90.0
GET_TIMEOUT = 300.0

# The plain Celery side: everything default except the broker and result backend
# (set from the command line) and the explicit JSON serializer.
plain_app = Celery("bench_plain", set_as_current=False)
plain_app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])


@plain_app.task(name="bench.square")
def plain_square(x):
    return x * x


def square(x):
    """What the gpulayer side runs (sent by value, as a user's own function is)."""
    return x * x


# --- the plain Celery worker (this file, run with --plain-worker) ---------------------------------

def run_plain_worker(broker: str, concurrency: int, loglevel: str) -> None:
    plain_app.conf.update(broker_url=broker, result_backend=broker)
    plain_app.worker_main(["worker", "--pool", "prefork", "--concurrency", str(concurrency), "--queues", PLAIN_QUEUE,
                           "--loglevel", loglevel, "--hostname", f"plain-{os.getpid()}@%h"])


def _die_with_parent() -> None:
    """Linux: a child gets SIGTERM if this benchmark dies without its finally running (e.g. SIGKILL)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start_plain_worker(broker: str, concurrency: int, loglevel: str, log_file: Path) -> subprocess.Popen:
    args = [sys.executable, os.path.abspath(__file__), "--plain-worker", "--broker", broker,
            "--concurrency", str(concurrency), "--loglevel", loglevel]
    with open(log_file, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_die_with_parent)


def wait_plain_worker(proc: subprocess.Popen, log_file: Path) -> None:
    """Until the worker answers a control ping and has run one job end to end."""
    deadline = time.monotonic() + WORKER_READY_TIMEOUT
    while not plain_app.control.ping(timeout=0.5):
        if proc.poll() is not None:
            raise RuntimeError(f"plain Celery worker exited with {proc.returncode}:\n"
                               f"{log_file.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"plain Celery worker did not answer a ping in {WORKER_READY_TIMEOUT:.0f}s")
    plain_square.apply_async((3,), queue=PLAIN_QUEUE).get(timeout=60)


# --- the three measured ways -------------------------------------------------------------------

def run_plain_delay(n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    handles = [plain_square.apply_async((i,), queue=PLAIN_QUEUE) for i in range(n)]
    t_sub = time.perf_counter() - t0
    results = [h.get(timeout=GET_TIMEOUT) for h in handles]
    t_e2e = time.perf_counter() - t0
    _check(results, n, "plain delay")
    return t_sub, t_e2e


def run_gpulayer_batch(n: int) -> tuple[float, float]:
    from gpulayer import submit, submit_batch

    t0 = time.perf_counter()
    batch = submit_batch([submit.s(square, i) for i in range(n)])
    t_sub = time.perf_counter() - t0
    results = batch.get(timeout=GET_TIMEOUT)
    t_e2e = time.perf_counter() - t0
    _check(results, n, "gpulayer batch")
    return t_sub, t_e2e


def run_gpulayer_delay(n: int) -> tuple[float, float]:
    from gpulayer import submit

    t0 = time.perf_counter()
    handles = [submit.delay(square, i) for i in range(n)]
    t_sub = time.perf_counter() - t0
    results = [h.get(timeout=GET_TIMEOUT) for h in handles]
    t_e2e = time.perf_counter() - t0
    _check(results, n, "gpulayer delay")
    return t_sub, t_e2e


def _check(results: list, n: int, what: str) -> None:
    if results != [i * i for i in range(n)]:
        raise AssertionError(f"{what}: wrong results (first few: {results[:5]})")


SIDES = {"plain delay": run_plain_delay, "gpulayer batch": run_gpulayer_batch, "gpulayer delay": run_gpulayer_delay}


# --- the run -----------------------------------------------------------------------------------

class Report:
    """Prints a line and keeps it for the results file."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


def _versions() -> str:
    import celery
    import kombu
    import redis

    from gpulayer import local

    try:
        server = subprocess.run([local.find_redis_server(), "--version"], capture_output=True, text=True,
                                timeout=10).stdout.split()[2].removeprefix("v=")
    except (OSError, IndexError, subprocess.SubprocessError):
        server = "?"
    return (f"python {platform.python_version()}, celery {celery.__version__}, kombu {kombu.__version__}, "
            f"redis-py {redis.__version__}, redis-server {server}")


def benchmark(args: argparse.Namespace) -> list[str]:
    from gpulayer.testing import Fleet

    out = Report()
    pool = args.workers * args.slots
    out(f"# throughput.py  {dt.datetime.now().isoformat(timespec='seconds')}  host {socket.gethostname()}  "
        f"cpus {os.cpu_count()}  load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    out(f"# {_versions()}")
    out(f"# jobs {args.jobs}, rounds {args.rounds} (+1 warm-up of {args.warmup_jobs}), gpulayer {args.workers} "
        f"worker(s) x {args.slots} slot(s), plain Celery 1 worker x concurrency {pool} (prefork), "
        f"worker loglevel {args.loglevel}")
    workdir = Path(tempfile.mkdtemp(prefix="gl-throughput-"))
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in SIDES}
    try:
        with Fleet(workdir, appendonly=False) as fleet:  # its exit stops the workers, then Redis, by pid
            plain_proc: subprocess.Popen | None = None
            try:
                plain_app.conf.update(broker_url=fleet.url, result_backend=fleet.url)
                plain_proc = start_plain_worker(fleet.url, pool, args.loglevel, workdir / "plain.log")
                for i in range(args.workers):
                    # tie_to_parent: the workers die with this process even if it is SIGKILLed.
                    fleet.add_worker(f"bench-{i + 1}", slots=args.slots, wait=False, tie_to_parent=True,
                                     extra_args=["--loglevel", args.loglevel])  # the last --loglevel wins
                fleet.wait_workers(list(fleet.workers), timeout=WORKER_READY_TIMEOUT)
                fleet.connect()
                wait_plain_worker(plain_proc, workdir / "plain.log")

                for fn in SIDES.values():  # warm-up: imports, connections, function caches on every pool process
                    fn(args.warmup_jobs)

                names = list(SIDES)
                out()
                out(f"{'round':>5}  {'side':<15} {'submit s':>9} {'end-to-end s':>13} {'jobs/s':>8}")
                for r in range(args.rounds):
                    order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
                    for name in order:
                        t_sub, t_e2e = SIDES[name](args.jobs)
                        rows[name].append((t_sub, t_e2e))
                        out(f"{r + 1:>5}  {name:<15} {t_sub:>9.3f} {t_e2e:>13.3f} {args.jobs / t_e2e:>8.0f}")
            finally:
                if plain_proc is not None:
                    from gpulayer import local

                    local.stop_process(plain_proc, grace=15)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    med = {name: (statistics.median(s for s, _ in v), statistics.median(e for _, e in v)) for name, v in rows.items()}
    rate = {name: args.jobs / e for name, (_, e) in med.items()}
    out()
    out(f"medians over {args.rounds} rounds, {args.jobs} jobs each:")
    out(f"  {'side':<15} {'submit s':>9} {'end-to-end s':>13} {'jobs/s':>8}")
    for name, (s, e) in med.items():
        out(f"  {name:<15} {s:>9.3f} {e:>13.3f} {rate[name]:>8.0f}")
    ratio_batch = rate["gpulayer batch"] / rate["plain delay"]
    ratio_delay = rate["gpulayer delay"] / rate["plain delay"]
    sub_batch = med["gpulayer batch"][0]
    out()
    out(f"gpulayer submit_batch jobs/s / plain Celery delay jobs/s: {ratio_batch:.2f}  (goal >= 1.0: "
        f"{'met' if ratio_batch >= 1.0 else 'NOT met'})")
    out(f"gpulayer delay jobs/s / plain Celery delay jobs/s:        {ratio_delay:.2f}")
    out(f"gpulayer submit_batch submission time for {args.jobs} jobs: {sub_batch:.3f} s  (goal < 0.5 s: "
        f"{'met' if sub_batch < 0.5 else 'NOT met'})")
    return out.lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000, help="jobs per side per round (default 2000)")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds; medians are quoted (default 5)")
    p.add_argument("--warmup-jobs", type=int, default=200, help="jobs per side in the warm-up round (default 200)")
    p.add_argument("--workers", type=int, default=2, help="gpulayer worker processes (default 2)")
    p.add_argument("--slots", type=int, default=1, help="slots per gpulayer worker (default 1); plain Celery "
                   "gets concurrency = workers x slots")
    p.add_argument("--loglevel", default="INFO", help="both sides' worker log level (default INFO, as "
                   "`gpulayer up` and Celery's tutorial run workers)")
    p.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--broker", help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plain_worker:
        run_plain_worker(args.broker, args.concurrency, args.loglevel)
        return 0
    if args.jobs < 1 or args.rounds < 1 or args.workers < 1 or args.slots < 1:
        p.error("--jobs, --rounds, --workers and --slots must be at least 1")
    unwind_on_signals()
    lines = benchmark(args)
    print(f"\nwritten to {write_results(lines, 'throughput.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
