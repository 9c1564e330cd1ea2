"""Two clusters on one host, as two users on a shared machine have them: nothing of one touched by the other.

    python benchmarks/two_clusters.py [--seconds 60]

Two embedded clusters (``gpulayer up``), each in its own ``GPULAYER_HOME``, each with workers named
``local-1`` and ``local-2`` and the same temp directory. For ``--seconds``, each cluster runs
``gpulayer train --nodes 2 --procs-per-node 1 --max-restarts 1`` of a script that writes files in its
working directory for a few seconds and checks they are still there, over and over, while a client
of each cluster sends ordinary jobs. Every worker sweeps its gang directories every 2 s. Before
issue 28 the sweeps of one cluster removed the other's directories (``FileNotFoundError`` in 3 of 3
runs). Prints the runs and jobs of each cluster and how many failed; exits 1 if any did.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import Report, unwind_on_signals, write_results  # same folder

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """\
import os, sys, time
rank = os.environ["RANK"]
for i in range(6):
    with open(f"rank{rank}-{i}.txt", "w") as f:
        f.write(str(i))
    time.sleep(0.5)
    missing = [n for n in (f"rank{rank}-{j}.txt" for j in range(i + 1)) if not os.path.exists(n)]
    if missing:
        sys.exit(f"rank {rank}: files gone from the working directory: {missing}")
print(f"rank {rank}: all files still there")
"""
JOBS = """\
import gpulayer
from gpulayer import submit_batch, submit
def square(x):
    return x * x
gpulayer.init()
out = submit_batch([submit.s(square, i) for i in range(50)]).get(timeout=120)
assert out == [i * i for i in range(50)], out
"""


def gpulayer_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpulayer", *args]


def loop(name: str, home: Path, work: Path, until: float, counts: dict, lock: threading.Lock, report: Report) -> None:
    env = dict(os.environ, GPULAYER_HOME=str(home), PYTHONPATH=str(REPO))
    while time.monotonic() < until:
        train = subprocess.run(gpulayer_cmd("train", "--nodes", "2", "--procs-per-node", "1", "--max-restarts", "1",
                                            "--no-pull", "--timeout", "120", "check_files.py"),
                               cwd=work, env=env, capture_output=True, text=True, timeout=300)
        jobs = subprocess.run([sys.executable, "-c", JOBS], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        with lock:
            counts[name]["train"] += 1
            counts[name]["jobs"] += 50
            if train.returncode != 0 or "restarting" in train.stderr:
                counts[name]["train_failed"] += 1
                report(f"{name}: gpulayer train failed or restarted (exit {train.returncode}):\n"
                       + (train.stdout + train.stderr)[-1500:])
            if jobs.returncode != 0:
                counts[name]["jobs_failed"] += 50
                report(f"{name}: a batch of 50 jobs failed:\n" + jobs.stderr[-1500:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long both clusters run work (default 60)")
    args = ap.parse_args()
    unwind_on_signals()
    report = Report("two_clusters")
    with tempfile.TemporaryDirectory(prefix="two-clusters-") as tmp:
        tmp = Path(tmp)
        shared_tmp = tmp / "tmp"
        shared_tmp.mkdir()
        homes = {name: tmp / name for name in ("a", "b")}
        started = []
        try:
            for name, home in homes.items():
                env = dict(os.environ, GPULAYER_HOME=str(home), PYTHONPATH=str(REPO), TMPDIR=str(shared_tmp))
                subprocess.run(gpulayer_cmd("up", "--workers", "2", "--slots", "2"), env=env, check=True,
                               capture_output=True, text=True, timeout=180)
                started.append(home)
                (home / "work").mkdir()
                (home / "work" / "check_files.py").write_text(SCRIPT)
            report(f"two clusters up (a, b), workers local-1 and local-2 in each, one TMPDIR {shared_tmp}")
            counts = {name: dict(train=0, train_failed=0, jobs=0, jobs_failed=0) for name in homes}
            lock = threading.Lock()
            until = time.monotonic() + args.seconds
            threads = [threading.Thread(target=loop, args=(name, home, home / "work", until, counts, lock, report))
                       for name, home in homes.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            for home in started:
                subprocess.run(gpulayer_cmd("down"), env=dict(os.environ, GPULAYER_HOME=str(home), PYTHONPATH=str(REPO)),
                               capture_output=True, timeout=120)
        left = sorted(p.name for p in shared_tmp.iterdir())
    failed = 0
    for name, c in counts.items():
        report(f"cluster {name}: {c['train']} gpulayer train runs, {c['train_failed']} failed or restarted; "
               f"{c['jobs']} jobs, {c['jobs_failed']} failed")
        failed += c["train_failed"] + c["jobs_failed"]
    report(f"left in the shared TMPDIR after both were down: {left or 'nothing'}")
    report.result("two_clusters", seconds=args.seconds, train_runs=sum(c["train"] for c in counts.values()),
                  failed=failed)
    print(f"\nwritten to {write_results(report.lines, 'two_clusters.txt')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
