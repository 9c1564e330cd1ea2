"""How long a script that used the process-scoped embedded cluster takes to exit after its last line.

Each run starts a fresh Python process (own empty ``GPULAYER_HOME``, no broker
configured) running a tiny script: ``gpulayer.init()`` (which starts Redis and
the default local workers for this process), one job, then, as its last line,
it prints ``time.monotonic()`` (one clock for every process on Linux). The
parent reads that line and notes ``time.monotonic()`` when the process has
exited; the difference is the exit time. It also notes how long ``gpulayer.init()``
took (starting the cluster), and checks that every process of
the embedded cluster (listed by the script just before its last line) is gone
by then.

    python benchmarks/exit_time.py [--runs 5] [--name exit_time.txt]

(``PYTHONPATH`` picks the checkout measured: ``benchmarks/cli_time.py --tree`` does the same for ``up``/``down``.)

Goal: under 1 s (median).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil

from common import unwind_on_signals, write_results  # same folder

SCRIPT = textwrap.dedent("""
    import json, time, psutil
    import gpulayer
    from gpulayer import submit

    t0 = time.monotonic()
    gpulayer.init()
    init_s = time.monotonic() - t0
    assert submit.delay(abs, -3).get(timeout=120) == 3
    tree = [p.pid for p in psutil.Process().children(recursive=True)]
    print(json.dumps({"tree": tree, "init_s": init_s}), flush=True)
    print(time.monotonic(), flush=True)   # the script's last line
""")


def one_run(script: str, home: str) -> tuple[float, float, int, int]:
    """(seconds from the last line to exit, seconds init() took, processes in the cluster, processes
    still alive after exit)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = home
    proc = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        first = json.loads(proc.stdout.readline())
        tree, init_s = first["tree"], first["init_s"]
        last = float(proc.stdout.readline())
        proc.wait(60)
        exited = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    alive = [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return exited - last, init_s, len(tree), len(alive)


def main() -> int:
    unwind_on_signals()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--name", default="exit_time.txt", help="the results file's name")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="gl-exit-")
    try:
        script = os.path.join(tmp, "script.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        lines = [f"# exit_time.py  {dt.datetime.now().isoformat(timespec='seconds')}  host {socket.gethostname()}"
                 f"  cpus {os.cpu_count()}  load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
                 f"# python {platform.python_version()}; gpulayer.init() with nothing configured (default shape), "
                 "one job, then the last line",
                 "", "run  last line -> exit s  init() s  cluster processes  alive after exit"]
        print("\n".join(lines), flush=True)
        times, inits = [], []
        for i in range(1, args.runs + 1):
            home = os.path.join(tmp, f"home-{i}")
            seconds, init_s, count, alive = one_run(script, home)
            times.append(seconds)
            inits.append(init_s)
            lines.append(f"{i:3d}  {seconds:19.3f}  {init_s:8.3f}  {count:17d}  {alive:16d}")
            print(lines[-1], flush=True)
        median = statistics.median(times)
        lines += ["", f"median over {args.runs} runs: {median:.3f} s from the last line to exit "
                      f"(goal: under 1 s: {'met' if median < 1.0 else 'NOT met'}); "
                      f"init() median {statistics.median(inits):.3f} s"]
        print("\n".join(lines[-2:]))
        print(f"written to {write_results(lines, args.name)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
