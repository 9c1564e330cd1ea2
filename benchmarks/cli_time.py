"""How long `gpulayer up`, `gpulayer down` and a one-job script against a running cluster take, and where it goes.

Each run, in a fresh ``GPULAYER_HOME`` with nothing configured:

1. ``python -m gpulayer up`` (default shape: Redis and 2 workers), timed from launch to exit;
2. the one-job script right after ``up`` returned (it must run: a job sent at once is not lost);
3. once every worker logged Celery's ``ready.``, the one-job script again: a user's script against a running
   cluster (``import gpulayer; gpulayer.init(); print(gpulayer.submit.delay(f, 1).get())``);
4. ``python -m gpulayer down``, timed likewise;
5. ``python -m gpulayer up --flower`` (it returns once Flower hears every worker), and ``down`` again.

Where the time goes, per run, in seconds from the command's launch: for ``up``, when the supervisor
process started, when Redis logged ``Ready to accept connections``, when the workers were started, when they
registered (their record's ``started_at``), when Celery logged them ``ready.`` (consuming), and when ``up``
returned; for ``down``, when the workers, Redis and the supervisor had exited (each pid watched through a
pidfd); for the script, its interpreter start, ``import gpulayer``, ``init()``, ``submit.delay``, ``.get()``
and last line -> exit. Last, one run of each command with ``-X importtime`` (``PYTHONPROFILEIMPORTTIME`` for
the supervisor and the workers, whose stderr is their log) gives the seconds each process spends importing,
and its biggest imports.

    python benchmarks/cli_time.py [--runs 5] [--tree PATH] [--before PATH] [--source] [--name cli_time.txt] [--note TEXT]

``--tree``: the gpulayer checkout to measure (``PYTHONPATH`` of every process; default this one);
``--before``: another (a ``git archive`` of main), measured in turn with it, run by run, so that both see the
same load on a shared machine, and their ratio printed. Goal: ``up`` and ``down`` under 2 s, the script under 0.5 s (medians).

Each tree's ``gpulayer`` is byte-compiled first (``compileall``), as ``pip install`` compiles an installed
package: a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (this VM's environment sets it) compiles its ~100
modules from source in every process, ~0.05-0.1 s each that no installed copy spends. ``--source`` measures
that instead: the trees' ``__pycache__`` folders removed, and every process run with
``PYTHONDONTWRITEBYTECODE=1`` (the condition of the logs before 2026-12-05 13:00).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from common import Report, unwind_on_signals, write_results  # same folder

SCRIPT = textwrap.dedent("""
    import time
    t_first = time.monotonic()
    import gpulayer
    t_import = time.monotonic()
    gpulayer.init()
    t_init = time.monotonic()

    def f(x):
        return x + 1

    h = gpulayer.submit.delay(f, 1)
    t_submit = time.monotonic()
    assert h.get(timeout=120) == 2
    t_get = time.monotonic()
    print(t_first, t_import, t_init, t_submit, t_get, flush=True)
    print(time.monotonic(), flush=True)   # the script's last line
""")
SCRIPT_PHASES = ("interpreter start", "import gpulayer", "init()", "submit.delay", ".get()", "last line -> exit")


SOURCE_ONLY = False  # --source: every process compiles gpulayer from source (main() sets it)


def _env(tree: Path, home: Path, **extra: str) -> dict:
    """The environment of every process measured. (They run in ``home``'s parent, a temporary folder: ``python -m``
    puts its working directory first on ``sys.path``, before ``PYTHONPATH``, and a checkout there would win.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_") and k != "PYTHONPROFILEIMPORTTIME"}
    env.update(GPULAYER_HOME=str(home), PYTHONPATH=str(tree), **extra)
    if SOURCE_ONLY:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def prepare_bytecode(tree: Path, source_only: bool) -> str:
    """Byte-compile ``tree``'s gpulayer as an install would, or (``source_only``) remove its compiled files."""
    package = tree / "gpulayer"
    if source_only:
        for cache in package.rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)
        return "from source (no __pycache__, PYTHONDONTWRITEBYTECODE=1)"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True)
    return "byte-compiled (compileall, as pip install does)"


def _cli(tree: Path, home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=_env(tree, home, **extra), capture_output=True, text=True,
                          timeout=180, cwd=home.parent)


def _wall_of_log(line: str) -> float | None:
    """The time of a Celery log line (``[2026-12-05 07:19:26,403: INFO/...``) or a Redis one
    (``13057:M 05 Dec 2026 07:19:23.584 * ...``), as a Unix time."""
    m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    if m:
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
    m = re.match(r"\d+:\w (\d\d \w{3} \d{4} \d\d:\d\d:\d\d)\.(\d{3})", line)
    if m:
        return time.mktime(time.strptime(m.group(1), "%d %b %Y %H:%M:%S")) + int(m.group(2)) / 1000
    return None


def _last_log_time(path: Path, needle: str) -> float | None:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if needle in ln]
    except OSError:
        return None
    return _wall_of_log(lines[-1]) if lines else None


def _state(home: Path) -> dict:
    return json.loads((home / "cluster.json").read_text())


def _registered(state: dict) -> dict[str, float]:
    """Each worker's record's ``started_at`` (Unix time), read from the cluster's registry."""
    from gpulayer.store.connection import connect_redis
    from gpulayer.store.registry import Registry

    client = connect_redis(state["broker_url"])
    try:
        return {w.id: w.started_at for w in Registry(client).snapshot()}
    finally:
        client.close()


def _consuming(home: Path, names: list[str], timeout: float = 120.0) -> float:
    """Wait until every worker has logged Celery's ``ready.``; the last such time (Unix)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        times = [_last_log_time(home / "logs" / f"{n}.log", " ready.") for n in names]
        if all(times):
            return max(times)
        time.sleep(0.05)
    raise TimeoutError(f"workers {names} did not log ready. within {timeout} s")


def time_up(tree: Path, home: Path, flower: bool = False) -> dict:
    import psutil

    wall0, t0 = time.time(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer", "up", *(["--flower"] if flower else [])],
                            env=_env(tree, home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=home.parent)
    # Process start times are the kernel's (in ticks since boot): measured from `up`'s own, not from time.time().
    born = psutil.Process(proc.pid).create_time()
    stdout, stderr = proc.communicate(timeout=180)
    took = time.monotonic() - t0
    if proc.returncode:
        raise RuntimeError(f"gpulayer up failed ({proc.returncode}):\n{stdout}\n{stderr}")
    state = _state(home)
    names = list(state["worker_pids"])
    reg = _registered(state)
    consuming = _consuming(home, names)
    worker_start = max(psutil.Process(p).create_time() for p in state["worker_pids"].values())
    return {"up": took,
            "supervisor started": psutil.Process(state["supervisor_pid"]).create_time() - born,
            "redis ready": (_last_log_time(home / "logs" / "redis.log", "Ready to accept") or wall0) - wall0,
            "workers started": worker_start - born,
            "workers registered": max(reg.values()) - wall0 if reg else float("nan"),
            "up returned": took,
            "workers consuming": consuming - wall0}


def _watch(pids: dict[str, list[int]], t0: float, gone: dict[str, float]) -> threading.Thread:
    """A thread that notes when the last pid of each group has exited (seconds after ``t0``)."""
    fds = {}
    for group, plist in pids.items():
        for pid in plist:
            try:
                fds[os.pidfd_open(pid)] = group
            except OSError:  # gone already
                gone[group] = 0.0
    left = {g: sum(1 for v in fds.values() if v == g) for g in pids}

    def run():
        while fds:
            ready, _, _ = select.select(list(fds), [], [], 60)
            if not ready:
                return
            for fd in ready:
                group = fds.pop(fd)
                os.close(fd)
                left[group] -= 1
                if not left[group]:
                    gone[group] = time.monotonic() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def time_down(tree: Path, home: Path) -> dict:
    import psutil

    state = _state(home)
    workers = []
    for pid in state["worker_pids"].values():  # each worker and what it started (pool, warm template)
        try:
            workers += [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            pass
    groups = {"workers exited": workers, "redis exited": [state["redis_pid"]],
              "supervisor exited": [state["supervisor_pid"]]}
    if state.get("flower_pid"):
        groups["flower exited"] = [state["flower_pid"]]
    gone: dict[str, float] = {}
    t0 = time.monotonic()
    watcher = _watch(groups, t0, gone)
    out = _cli(tree, home, "-m", "gpulayer", "down")
    took = time.monotonic() - t0
    if out.returncode or "stopped" not in out.stdout:
        raise RuntimeError(f"gpulayer down failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    watcher.join(10)
    return {"down": took, **{g: gone.get(g, float("nan")) for g in groups}, "down returned": took}


def time_script(tree: Path, home: Path, script: Path) -> dict:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(tree, home), stdout=subprocess.PIPE, text=True,
                            cwd=home.parent)
    try:
        marks = [float(x) for x in proc.stdout.readline().split()]
        last = float(proc.stdout.readline())
        proc.wait(60)
        t_exit = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode:
        raise RuntimeError(f"the one-job script failed with {proc.returncode}")
    points = [t0, *marks, last, t_exit]
    phases = {name: points[i + 1] - points[i] for i, name in enumerate(SCRIPT_PHASES[:5])}
    phases["last line -> exit"] = t_exit - last
    return {"script": t_exit - t0, **phases}


# -- import time ----------------------------------------------------------------------------------------
def _importtime(text: str, top: int = 4) -> str:
    """Seconds spent importing (the sum of the top-level imports' cumulative times) and the biggest of them."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(3)) == 1:  # a top-level import (nested ones are indented further)
            rows.append((int(m.group(2)) / 1e6, m.group(4)))
    if not rows:
        return "no import lines"
    rows.sort(reverse=True)
    return f"{sum(s for s, _ in rows):.3f} s importing; " + ", ".join(f"{n} {s:.3f}" for s, n in rows[:top])


def import_report(tree: Path, home: Path, script: Path, report: Report) -> None:
    report("")
    report(f"import time, {tree} (one run each, -X importtime / PYTHONPROFILEIMPORTTIME):")
    out = _cli(tree, home, "-X", "importtime", "-m", "gpulayer", "up")
    report(f"  gpulayer up (CLI)        {_importtime(out.stderr)}")
    down_home = home.parent / (home.name + "-profiled")
    profiled = _cli(tree, down_home, "-m", "gpulayer", "up", PYTHONPROFILEIMPORTTIME="1")
    if profiled.returncode == 0:
        state = _state(down_home)
        _consuming(down_home, list(state["worker_pids"]))
        report(f"  supervisor               {_importtime((down_home / 'supervisor.log').read_text(errors='replace'))}")
        name = next(iter(state["worker_pids"]))
        report(f"  worker {name}         {_importtime((down_home / 'logs' / f'{name}.log').read_text(errors='replace'))}")
        _cli(tree, down_home, "-m", "gpulayer", "down")
    out = _cli(tree, home, "-X", "importtime", str(script))
    report(f"  one-job script           {_importtime(out.stderr)}")
    out = _cli(tree, home, "-X", "importtime", "-m", "gpulayer", "down")
    report(f"  gpulayer down (CLI)      {_importtime(out.stderr)}")


def _table(report: Report, title: str, runs: list[dict], keys: list[str]) -> None:
    report("")
    report(title)
    report(f"  {'':24s}" + "".join(f"{f'run {i + 1}':>9s}" for i in range(len(runs))) + f"{'median':>9s}")
    for key in keys:
        values = [r[key] for r in runs]
        report(f"  {key:24s}" + "".join(f"{v:9.3f}" for v in values) + f"{statistics.median(values):9.3f}")


def one_run(tree: Path, home: Path, script: Path) -> dict[str, dict]:
    """``up``, the script right after it, the script once the workers consume, ``down``: each one's figures."""
    run = {"up": time_up(tree, home)}
    # A job sent right after `up` returned runs (it waits for the workers if they are not consuming yet).
    run["first"] = time_script(tree, home, script)
    run["script"] = time_script(tree, home, script)
    run["down"] = time_down(tree, home)
    run["up_flower"] = time_up(tree, home, flower=True)
    run["down_flower"] = time_down(tree, home)
    return run


def report_tree(report: Report, label: str, runs: list[dict]) -> dict[str, float]:
    """The tables of one tree's runs; its medians."""
    report("")
    report(f"== {label}")
    _table(report, "gpulayer up: seconds from launch", [r["up"] for r in runs],
           ["supervisor started", "redis ready", "workers started", "workers registered", "up returned",
            "workers consuming"])
    _table(report, "one-job script right after up returned: seconds per phase", [r["first"] for r in runs],
           ["script", *SCRIPT_PHASES])
    _table(report, "one-job script, workers consuming: seconds per phase", [r["script"] for r in runs],
           ["script", *SCRIPT_PHASES])
    _table(report, "gpulayer down: seconds from launch", [r["down"] for r in runs],
           [k for k in runs[0]["down"] if k != "down"])
    _table(report, "gpulayer up --flower: seconds from launch", [r["up_flower"] for r in runs],
           ["supervisor started", "redis ready", "workers started", "workers registered", "workers consuming",
            "up returned"])
    _table(report, "gpulayer down (with Flower): seconds from launch", [r["down_flower"] for r in runs],
           [k for k in runs[0]["down_flower"] if k != "down"])
    return {"up": statistics.median(r["up"]["up"] for r in runs),
            "up_flower": statistics.median(r["up_flower"]["up"] for r in runs),
            "down": statistics.median(r["down"]["down"] for r in runs),
            "script": statistics.median(r["script"]["script"] for r in runs),
            "first_script": statistics.median(r["first"]["script"] for r in runs)}


def main() -> int:
    unwind_on_signals()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent,
                   help="the gpulayer checkout to measure (default: this one)")
    p.add_argument("--before", type=Path, default=None,
                   help="another checkout (e.g. a `git archive` of main) measured in turn with --tree, run by run, "
                        "so both see the same load")
    p.add_argument("--name", default="cli_time.txt", help="the results file's name")
    p.add_argument("--note", default="", help="a line for the results file's header (what the trees are, the load)")
    p.add_argument("--source", action="store_true",
                   help="run every process on gpulayer's source, not byte-compiled (see the module docstring)")
    args = p.parse_args()
    global SOURCE_ONLY
    SOURCE_ONLY = args.source
    trees = {"after": args.tree.resolve()}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the registry reader
    tmp = Path(tempfile.mkdtemp(prefix="gl-cli-"))
    report = Report("cli_time")
    report(f"# cli_time.py  {dt.datetime.now().isoformat(timespec='seconds')}  host {socket.gethostname()}  "
           f"cpus {os.cpu_count()}  load at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for label, tree in trees.items():
        commit = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True,
                                text=True).stdout.strip()[:90] or "not a git checkout"
        where = _cli(tree, tmp / "probe", "-c", "import gpulayer; print(gpulayer.__file__)").stdout.strip()
        if not where.startswith(str(tree)):
            raise SystemExit(f"{tree}: its processes would import gpulayer from {where}")
        report(f"# {label}: {tree} ({commit}); gpulayer imported from {where}; "
               f"{prepare_bytecode(tree, args.source)}")
    report(f"# python {platform.python_version()}" + (f"; {args.note}" if args.note else ""))
    homes: list[tuple[Path, Path]] = []
    try:
        script = tmp / "one_job.py"
        script.write_text(SCRIPT)
        runs: dict[str, list] = {label: [] for label in trees}
        for i in range(args.runs):
            for label, tree in trees.items():
                home = tmp / f"{label}-{i + 1}"
                homes.append((tree, home))
                runs[label].append(one_run(tree, home, script))
                r = runs[label][-1]
                report(f"run {i + 1} {label:6s}: up {r['up']['up']:.3f} s, first job script "
                       f"{r['first']['script']:.3f} s, script {r['script']['script']:.3f} s, down "
                       f"{r['down']['down']:.3f} s, up --flower {r['up_flower']['up']:.3f} s  "
                       f"(load {os.getloadavg()[0]:.2f})")
        meds = {label: report_tree(report, f"{label}: {tree}", runs[label]) for label, tree in trees.items()}
        for label, tree in trees.items():
            import_report(tree, tmp / f"{label}-import", script, report)
            homes += [(tree, tmp / f"{label}-import"), (tree, tmp / f"{label}-import-profiled")]
        report("")
        for label, med in meds.items():
            report(f"{label}: medians of {args.runs}: up {med['up']:.3f} s, up --flower {med['up_flower']:.3f} s, "
                   f"down {med['down']:.3f} s (goal under 2 s each); one-job script {med['script']:.3f} s (goal "
                   f"under 0.5 s), right after up {med['first_script']:.3f} s")
            report.result(label, up_s=med["up"], up_flower_s=med["up_flower"], down_s=med["down"],
                          script_s=med["script"], first_script_s=med["first_script"])
        if "before" in meds:
            b, a = meds["before"], meds["after"]
            report("before / after: " + ", ".join(f"{k} {b[k] / a[k]:.2f}x" for k in ("up", "up_flower", "down",
                                                                                     "script", "first_script")))
        report(f"load at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"written to {write_results(report.lines, args.name)}")
    finally:
        for tree, home in homes:  # anything a failed run left
            if (home / "cluster.json").exists():
                _cli(tree, home, "-m", "gpulayer", "down")
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
