"""gpulayer's Trainer at two revisions, side by side: did a change make the fast path slower?

Runs bench.py's gpulayer worker for each case from two checkouts (``--old``, ``--new``: e.g. a
``git worktree add /tmp/old <commit>``), alternating which goes first, at 100 and 600 steps;
ms/step = (median at 600 - median at 100) / 500, in wall time (first step to end of fit) and in
CPU time of the whole process tree (less sensitive to a shared machine's load). Prints new/old.

    python benchmarks/lightning_comparison/ab_revisions.py --old /tmp/old --new . --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

CASES = {
    "mlp": {"name": "MLP fp32, batch 256", "model": "mlp", "batch": 256, "precision": "32-true", "device": "cpu"},
    "bf16": {"name": "MLP bf16-mixed, batch 256", "model": "mlp", "batch": 256, "precision": "bf16-mixed",
             "device": "cpu"},
    "cnn": {"name": "small CNN fp32, batch 32", "model": "cnn", "batch": 32, "precision": "32-true", "device": "cpu"},
    "ddp": {"name": "MLP DDP 2 CPU processes (defaults)", "model": "mlp", "batch": 256, "precision": "32-true",
            "device": "cpu", "devices": 2, "defaults": True},
}
LO, HI = 100, 600


def one(tree: str, case: dict, steps: int) -> tuple[float, float]:
    """(wall seconds first step -> end of fit, CPU seconds of the process tree) for one fresh process."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=tree)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, os.path.join(tree, "benchmarks/lightning_comparison/bench.py"), "--worker",
                           json.dumps(case), "gpulayer", str(steps)], capture_output=True, text=True, env=env, cwd=tree)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{tree} {case['name']} {steps} steps failed:\n{proc.stderr[-2000:]}")
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return out["end_at"] - out["first_step_at"], cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="checkout of the earlier revision")
    ap.add_argument("--new", default=".", help="checkout of the later revision (default: here)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES)}")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    trees = {"old": os.path.abspath(a.old), "new": os.path.abspath(a.new)}
    print(f"# old {trees['old']}  new {trees['new']}  repeats {a.repeats}  cpus {os.cpu_count()}")
    for name in a.cases.split(","):
        times = {(t, s, k): [] for t in trees for s in (LO, HI) for k in (0, 1)}
        for i in range(a.repeats):
            order = list(trees) if i % 2 == 0 else list(trees)[::-1]
            for steps in (LO, HI):
                for t in order:
                    for k, v in enumerate(one(trees[t], CASES[name], steps)):
                        times[(t, steps, k)].append(v)
        ms = {(t, k): (statistics.median(times[(t, HI, k)]) - statistics.median(times[(t, LO, k)])) / (HI - LO) * 1e3
              for t in trees for k in (0, 1)}
        print(f"{name:5s} wall ms/step old {ms[('old', 0)]:.3f} new {ms[('new', 0)]:.3f} new/old "
              f"{ms[('new', 0)] / ms[('old', 0)]:.3f} | cpu ms/step old {ms[('old', 1)]:.3f} new {ms[('new', 1)]:.3f} "
              f"new/old {ms[('new', 1)] / ms[('old', 1)]:.3f} | load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
