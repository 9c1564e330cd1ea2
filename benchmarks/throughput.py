"""Throughput of tiny jobs: gpulayer (``submit_batch``, ``submit.delay``) against plain Celery (``.delay``) and
Ray's tasks (``.remote``, when ``import ray`` works).

One run starts one Redis on a free loopback port, then, for each configuration of ``--shapes`` in turn
(``WxS``: W gpulayer workers x S slots each; default 2x1 and 1x2), every side's workers:

- plain Celery: a Celery app defined in this file, JSON serializer, default
  settings except the result backend (the same Redis), one worker with the
  prefork pool and ``--concurrency`` = the gpulayer side's total slots, on its
  own queue. The worker is this script run with ``--plain-worker``.
- gpulayer: W ``gpulayer worker`` processes with S slots each.
- Ray: a local Ray instance started by ``ray.init(num_cpus=W x S)`` in this
  process (no dashboard), so its tasks run on as many worker processes as the
  other sides have pool processes.

Each round times four ways of running ``--jobs`` calls of ``square(i)``:

- ``plain delay``:   one ``square.delay(i)`` per job, then ``r.get()`` on each handle;
- ``gpulayer batch``: ``submit_batch([submit.s(square, i) ...])`` then ``.get()``;
- ``gpulayer delay``: one ``submit.delay(square, i)`` per job, then ``h.get()`` on each;
- ``ray tasks``:      one ``ray.remote(square).remote(i)`` per job, then one ``ray.get`` on all.

``submit`` is the time until every publish call returned; ``end-to-end`` is from
the first publish to every result in hand; jobs/s = jobs / end-to-end. Every
side's start-up (workers, ``ray.init``) and a warm-up round are outside the
timed part. Rounds rotate the order of the sides; the medians are quoted.
Without Ray the Ray side is skipped (the log says why) and the rest runs.

    python benchmarks/throughput.py [--jobs 2000] [--rounds 5] [--shapes 2x1,1x2] [--output throughput.txt]
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
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

import psutil
from celery import Celery

PLAIN_QUEUE = "bench.plain"
WORKER_READY_TIMEOUT = 90.0
GET_TIMEOUT = 300.0
RAY_START_ATTEMPTS = 3
IDLE_WINDOW = 3.0  # seconds over which each side's idle CPU use is sampled
RAY_PIP = "`make bench-ray`, or pip install -e '.[bench-ray]' (ray==2.58.0) in a venv of its own (benchmarks/README.md)"

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


def start_plain_worker(broker: str, concurrency: int, loglevel: str, log_file: Path) -> subprocess.Popen:
    from gpulayer.procs.stop import die_with_parent  # here: the plain worker runs this file without gpulayer

    args = [sys.executable, os.path.abspath(__file__), "--plain-worker", "--broker", broker,
            "--concurrency", str(concurrency), "--loglevel", loglevel]
    # The worker gets SIGTERM if this benchmark dies without its finally running (e.g. SIGKILL).
    with open(log_file, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))


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
RAY_SIDE = "ray tasks"


# --- the Ray side (optional) -------------------------------------------------------------------

def import_ray():
    """``(ray, None)``, or ``(None, why)`` when Ray is not installed or does not import."""
    try:
        import ray
    except Exception as err:  # ImportError, or a broken install failing on import
        return None, f"import ray failed ({type(err).__name__}: {err})"
    return ray, None


class RayTasks:
    """A local Ray instance of ``num_cpus`` CPUs in this process; calling it times one round.

    ``ray.init`` starts Ray's processes (GCS, raylet, its agents, the task workers) as children of this process,
    tied to it (they die with it); ``close`` (``ray.shutdown``) stops them. Its session files go under
    ``temp_dir``, which the run removes.
    """

    def __init__(self, ray, num_cpus: int, temp_dir: Path):
        self.ray = ray
        self.temp_dir = temp_dir
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            try:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                         _temp_dir=str(temp_dir))
                break
            except Exception as err:
                # Its raylet must register within a fixed 30 s, which a loaded machine can miss: start-up is
                # not timed, so try again.
                ray.shutdown()  # whatever it had started
                if attempt == RAY_START_ATTEMPTS:
                    raise
                print(f"# ray.init failed ({err}); attempt {attempt + 1} of {RAY_START_ATTEMPTS}", flush=True)
        unwind_on_signals()  # ray.init installs its own SIGTERM handler; ours gives the 128 + signal exit code
        self.square = ray.remote(square)  # sent by value, as gpulayer sends square

    def __call__(self, n: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        refs = [self.square.remote(i) for i in range(n)]
        t_sub = time.perf_counter() - t0
        try:
            results = self.ray.get(refs, timeout=GET_TIMEOUT)
        except self.ray.exceptions.RayError as err:  # the run's folder goes at exit: show what Ray's node logged
            raylet = self.temp_dir / "session_latest" / "logs" / "raylet.out"
            tail = raylet.read_text(errors="replace")[-3000:] if raylet.exists() else "(no raylet.out)"
            raise RuntimeError(f"{RAY_SIDE}: {type(err).__name__}: {err}\nend of {raylet.name}:\n{tail}") from err
        t_e2e = time.perf_counter() - t0
        _check(results, n, RAY_SIDE)
        return t_sub, t_e2e

    def close(self) -> None:
        self.ray.shutdown()


# --- idle CPU: what each side's processes cost the others while they wait ----------------------

def _tree(pids) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return procs


def _cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _side_processes(fleet, names: list[str], plain_proc: subprocess.Popen, with_ray: bool
                    ) -> dict[str, list[psutil.Process]]:
    groups = {"gpulayer workers": _tree(fleet.workers[n].pid for n in names),
              "plain Celery worker": _tree([plain_proc.pid]), "redis": _tree([fleet.redis_proc.pid])}
    if with_ray:  # Ray's processes are this process's other children
        ours = fleet.pids() | {plain_proc.pid}
        groups["ray"] = _tree(c.pid for c in psutil.Process().children() if c.pid not in ours)
    return groups


def idle_cpu(groups: dict[str, list[psutil.Process]], window: float = IDLE_WINDOW) -> dict[str, float]:
    """Percent of one core each group of processes uses over ``window`` seconds with no job in flight."""
    before = {name: _cpu_seconds(procs) for name, procs in groups.items()}
    time.sleep(window)  # a measurement window, not a wait for a condition
    return {name: 100 * (_cpu_seconds(procs) - before[name]) / window for name, procs in groups.items()}


# --- the run -----------------------------------------------------------------------------------

class Report:
    """Prints a line and keeps it for the results file."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


def _versions(ray) -> str:
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
            f"redis-py {redis.__version__} ({'hiredis ' + _hiredis() if redis.utils.HIREDIS_AVAILABLE else 'Python'} "
            f"parser), redis-server {server}, ray {ray.__version__ if ray else '-'}")


def _hiredis() -> str:
    from importlib.metadata import version

    return version("hiredis")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


Shape = tuple[int, int]  # (gpulayer workers, slots per worker)


def run_shape(fleet, shape: Shape, args: argparse.Namespace, out: Report, ray, workdir: Path
              ) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Start every side's workers for one configuration, warm up, run the rounds, stop them; median jobs/s per side,
    and the median per-round ratio of each pair of ``_PAIRS``."""
    from gpulayer.procs.stop import stop_process

    workers, slots = shape
    pool = workers * slots
    out()
    out(f"## gpulayer {workers} worker(s) x {slots} slot(s), plain Celery 1 worker x concurrency {pool} (prefork), "
        f"Ray num_cpus {pool if ray else '- (skipped)'}  load {_load()}")
    names = [f"bench-{workers}x{slots}-{i + 1}" for i in range(workers)]
    log_file = workdir / f"plain-{workers}x{slots}.log"
    rows: dict[str, list[tuple[float, float]]] = {}
    plain_proc: subprocess.Popen | None = None
    ray_tasks: RayTasks | None = None
    try:
        plain_proc = start_plain_worker(fleet.url, pool, args.loglevel, log_file)
        for name in names:
            # tie_to_parent: the workers die with this process even if it is SIGKILLed.
            fleet.add_worker(name, slots=slots, wait=False, tie_to_parent=True,
                             extra_args=["--loglevel", args.loglevel])  # the last --loglevel wins
        fleet.wait_workers(names, timeout=WORKER_READY_TIMEOUT)
        wait_plain_worker(plain_proc, log_file)
        sides = dict(SIDES)
        if ray is not None:
            ray_tasks = RayTasks(ray, pool, workdir / f"ray-{workers}x{slots}")
            sides[RAY_SIDE] = ray_tasks
        rows = {name: [] for name in sides}

        for fn in sides.values():  # warm-up: imports, connections, function caches on every pool process
            fn(args.warmup_jobs)

        # Every side's processes stay up through every round; what they use while another side runs:
        use = idle_cpu(_side_processes(fleet, names, plain_proc, with_ray=ray_tasks is not None))
        out(f"# idle CPU, % of one core over {IDLE_WINDOW:.0f} s after the warm-up: "
            + ", ".join(f"{name} {pct:.1f}" for name, pct in use.items()))

        order0 = list(sides)
        out()
        out(f"{'round':>5}  {'side':<15} {'submit s':>9} {'end-to-end s':>13} {'jobs/s':>8}")
        for r in range(args.rounds):
            order = order0[r % len(order0):] + order0[: r % len(order0)]  # rotate who goes first
            for name in order:
                t_sub, t_e2e = sides[name](args.jobs)
                rows[name].append((t_sub, t_e2e))
                out(f"{r + 1:>5}  {name:<15} {t_sub:>9.3f} {t_e2e:>13.3f} {args.jobs / t_e2e:>8.0f}")
    finally:
        if ray_tasks is not None:
            ray_tasks.close()
        if plain_proc is not None:
            stop_process(plain_proc, grace=15)
        for name in names:
            fleet.stop_worker(name)

    med = {name: (statistics.median(s for s, _ in v), statistics.median(e for _, e in v)) for name, v in rows.items()}
    rate = {name: args.jobs / e for name, (_, e) in med.items()}
    out()
    out(f"medians over {args.rounds} rounds, {args.jobs} jobs each (load {_load()}):")
    out(f"  {'side':<15} {'submit s':>9} {'end-to-end s':>13} {'jobs/s':>8}")
    for name, (s, e) in med.items():
        out(f"  {name:<15} {s:>9.3f} {e:>13.3f} {rate[name]:>8.0f}")
    out()
    for line in _ratios(rate, med["gpulayer batch"][0], args.jobs):
        out(line)
    out()
    out("per-round ratios (a round's sides run back to back, so a slow spell of a shared machine hits them alike):")
    paired: dict[tuple[str, str], float] = {}
    for (a, b), goal in _PAIRS.items():
        if a in rows and b in rows:
            each = [e_b / e_a for (_, e_a), (_, e_b) in zip(rows[a], rows[b])]
            paired[a, b] = statistics.median(each)
            out(f"  {a + ' / ' + b:<30} " + " ".join(f"{x:.2f}" for x in each)
                + f"   median {paired[a, b]:.2f}, goal >= {goal} met in {sum(x >= goal for x in each)} of {len(each)}")
    return rate, paired


# (side, side it is compared with): the goal for the first's jobs/s over the second's
_PAIRS = {("gpulayer batch", RAY_SIDE): 1.5, ("gpulayer delay", "plain delay"): 2.0}  # issue 29's goals


def _goal(value: float, goal: float) -> str:
    return f"(goal >= {goal}: {'met' if value >= goal else 'NOT met'})"


def _ratios(rate: dict[str, float], sub_batch: float, jobs: int) -> list[str]:
    batch, delay, plain = rate["gpulayer batch"], rate["gpulayer delay"], rate["plain delay"]
    ray_line = (f"{batch / rate[RAY_SIDE]:.2f}  {_goal(batch / rate[RAY_SIDE], _PAIRS['gpulayer batch', RAY_SIDE])}"
                if RAY_SIDE in rate
                else "skipped (no Ray)")
    return [f"gpulayer submit_batch jobs/s / Ray tasks jobs/s:          {ray_line}",
            f"gpulayer delay jobs/s / plain Celery delay jobs/s:        {delay / plain:.2f}  "
            f"{_goal(delay / plain, _PAIRS['gpulayer delay', 'plain delay'])}",
            f"gpulayer submit_batch jobs/s / plain Celery delay jobs/s: {batch / plain:.2f}  {_goal(batch / plain, 1.0)}",
            f"gpulayer submit_batch submission time for {jobs} jobs: {sub_batch:.3f} s  (goal < 0.5 s: "
            f"{'met' if sub_batch < 0.5 else 'NOT met'})"]


def benchmark(args: argparse.Namespace) -> list[str]:
    from gpulayer.lab.fleet import Fleet

    out = Report()
    ray, no_ray = import_ray()
    out(f"# throughput.py  {dt.datetime.now().isoformat(timespec='seconds')}  host {socket.gethostname()}  "
        f"cpus {os.cpu_count()}  load {_load()}")
    out(f"# {_versions(ray)}")
    out(f"# jobs {args.jobs}, rounds {args.rounds} (+1 warm-up of {args.warmup_jobs}), configurations "
        f"{', '.join(f'{w}x{s}' for w, s in args.shapes)} (gpulayer workers x slots; plain Celery's concurrency and "
        f"Ray's num_cpus = workers x slots), worker loglevel {args.loglevel}")
    if ray is None:
        out(f"# Ray side skipped: {no_ray}; to run it: {RAY_PIP}")
    workdir = Path(tempfile.mkdtemp(prefix="gl-throughput-"))
    rates: dict[Shape, dict[str, float]] = {}
    paired_by: dict[Shape, dict[tuple[str, str], float]] = {}
    try:
        with Fleet(workdir, appendonly=False) as fleet:  # its exit stops the workers, then Redis, by pid
            plain_app.conf.update(broker_url=fleet.url, result_backend=fleet.url)
            fleet.connect()  # once: every configuration's workers join the same Redis
            for shape in args.shapes:
                rates[shape], paired_by[shape] = run_shape(fleet, shape, args, out, ray, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    sides = list(next(iter(rates.values())))
    out()
    out(f"summary, median jobs/s (load {_load()}); the ratios of the medians, then (paired) the medians of the "
        f"per-round ratios:")
    out(f"  {'workers x slots':<16}" + "".join(f"{name:>16}" for name in sides)
        + f"{'batch / ray':>13}{'delay / plain':>15}{'(paired)':>10}{'(paired)':>10}")
    for (w, s), rate in rates.items():
        vs_ray = f"{rate['gpulayer batch'] / rate[RAY_SIDE]:.2f}" if RAY_SIDE in rate else "-"
        paired = [paired_by[w, s].get(pair) for pair in _PAIRS]
        out(f"  {f'{w} x {s}':<16}" + "".join(f"{rate[name]:>16.0f}" for name in sides)
            + f"{vs_ray:>13}{rate['gpulayer delay'] / rate['plain delay']:>15.2f}"
            + "".join(f"{x:>10.2f}" if x is not None else f"{'-':>10}" for x in paired))
    return out.lines


def _shapes(text: str) -> list[Shape]:
    try:
        shapes = [tuple(int(x) for x in part.lower().split("x")) for part in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(sh) != 2 or min(sh) < 1 for sh in shapes):
        raise argparse.ArgumentTypeError(f"expected WxS[,WxS...] with W, S >= 1 (e.g. 2x1,1x2), got {text!r}")
    return shapes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000, help="jobs per side per round (default 2000)")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds; medians are quoted (default 5)")
    p.add_argument("--warmup-jobs", type=int, default=200, help="jobs per side in the warm-up round (default 200)")
    p.add_argument("--shapes", type=_shapes, default=_shapes("2x1,1x2"), metavar="WxS[,WxS...]",
                   help="configurations, one after another: W gpulayer workers x S slots each; plain Celery gets "
                   "concurrency W x S, Ray num_cpus W x S (default 2x1,1x2)")
    p.add_argument("--loglevel", default="INFO", help="both sides' worker log level (default INFO, as "
                   "`gpulayer up` and Celery's tutorial run workers)")
    p.add_argument("--output", default="throughput.txt", help="results file name under "
                   "benchmarks/results/<date>-<host>/ (default throughput.txt)")
    p.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--broker", help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plain_worker:
        run_plain_worker(args.broker, args.concurrency, args.loglevel)
        return 0
    if args.jobs < 1 or args.rounds < 1:
        p.error("--jobs and --rounds must be at least 1")
    unwind_on_signals()
    lines = benchmark(args)
    print(f"\nwritten to {write_results(lines, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
