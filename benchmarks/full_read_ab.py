"""The registry's full read (``Registry.read``) against the same read of an earlier commit, alternating.

Claim: at 10,000 heartbeating workers the full read (a client's first view of the fleet) takes under
50 ms on the project's 2-core VM. On a VM shared with other work the wall time moves with the load, so
this script measures this checkout's read and the read of ``--against`` (a git revision: its
``gpulayer/store/registry.py`` and ``packed.py``, loaded beside ours) in one process on one Redis,
in alternating rounds of 3 reads each, and prints both medians, the ratio and the load average. Each
read's result is kept until its clock stops (the freeing of the previous snapshot is not the read's).
Wall time and this process's CPU time are both printed: under load the wall time is mostly waiting
for a core.

    python benchmarks/full_read_ab.py [--against REV] [--workers 10000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Report, unwind_on_signals, write_results  # same folder
from placement_scale import synthetic_fleet  # same folder

REPO = Path(__file__).resolve().parents[1]


def registry_at(rev: str, tmp: Path):
    """``gpulayer.store.registry`` as it was at ``rev``, importable beside today's (its own ``packed``)."""
    import gpulayer.store  # the package the revision's relative imports resolve in

    tag = "".join(c if c.isalnum() else "_" for c in rev)
    mods = {}
    for name in ("packed", "registry"):
        src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:gpulayer/store/{name}.py"], check=True,
                             capture_output=True, text=True).stdout
        src = src.replace("from .packed import", f"from .packed_at_{tag} import")
        path = tmp / f"{name}_at_{tag}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"{gpulayer.store.__name__}.{name}_at_{tag}", path)
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mods[name]
        spec.loader.exec_module(mods[name])
    return mods["registry"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--against", default="HEAD", help="the git revision to compare with (default HEAD)")
    p.add_argument("--workers", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=20, help="alternating rounds of 3 reads on each side")
    args = p.parse_args()
    unwind_on_signals()
    from gpulayer.lab.fleet import Fleet
    from gpulayer.store.registry import Registry, static_record

    out = Report("full_read_ab")
    fleet = list(synthetic_fleet(args.workers))
    statics = {w.id: static_record(w) for w in fleet}
    with tempfile.TemporaryDirectory() as tmp, Fleet(Path(tmp), password=None) as redis_fleet:
        old = registry_at(args.against, Path(tmp))
        client = redis_fleet.client()
        sides = {"this checkout": Registry(client, dead_after=600.0),  # nobody dies while we measure
                 args.against: old.Registry(client, dead_after=600.0)}
        sides["this checkout"].heartbeat_many(fleet, statics)
        reads = {name: reg.read() for name, reg in sides.items()}
        a, b = reads.values()
        assert a[0] == b[0] and [w.model_dump(exclude={"heartbeat_age"}) for w in a[1]] == \
            [w.model_dump(exclude={"heartbeat_age"}) for w in b[1]], "the two reads differ"
        assert all(reg._read_packed() is not None for reg in sides.values()), "a read left its direct path"
        del reads, a, b
        wall = {name: [] for name in sides}
        cpu = {name: [] for name in sides}
        loads = []
        order = list(sides.items())
        for r in range(args.rounds):
            for name, reg in order if r % 2 == 0 else order[::-1]:
                for _ in range(3):
                    t0, c0 = time.perf_counter(), time.process_time()
                    got = reg.read()
                    wall[name].append((time.perf_counter() - t0) * 1e3)
                    cpu[name].append((time.process_time() - c0) * 1e3)
                    del got
            loads.append(os.getloadavg()[0])
        out(f"full read of {args.workers} workers (redis {client.info('server')['redis_version']}), "
            f"{args.rounds} alternating rounds of 3 reads; load average {min(loads):.1f}-{max(loads):.1f}")
        for name in sides:
            w, c = sorted(wall[name]), cpu[name]
            out(f"  {name:<16} wall median {statistics.median(w):7.1f} ms  p90 {w[int(len(w) * 0.9)]:7.1f}  "
                f"client CPU median {statistics.median(c):6.1f} ms")
            out.result(name, workers=args.workers, median_ms=statistics.median(w), cpu_median_ms=statistics.median(c))
        now_, then = (statistics.median(wall[n]) for n in sides)
        out(f"  ratio {args.against} / this checkout: {then / now_:.2f}x wall, "
            f"{statistics.median(cpu[args.against]) / statistics.median(cpu['this checkout']):.2f}x client CPU; "
            f"goal under 50 ms: {'met' if now_ < 50 else 'not met'} at this load")
        client.close()
    print("wrote", write_results(out.lines, "full_read_ab.txt"))


if __name__ == "__main__":
    main()
