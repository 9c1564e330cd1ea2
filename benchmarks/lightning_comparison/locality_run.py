"""The 4-machine job in one zone, in two zones of one region, across two regions, and where gpulayer puts it.

The lab (``scaling.open_lab``, shaped: 2 Gbit/s across zones, 200 Mbit/s across regions) has 8 machines:
region r1 with zones r1-a (4 machines) and r1-b (2), region r2 with zone r2-a (2). One ``gpulayer
worker`` per machine, 2 slots. The job is ``scaling_run.py``'s CNN as one
``Trainer(num_nodes=4, devices=2)`` fit (grad sync ``auto``: two-level), pinned with
``cluster_resources=Resources(worker_ids=...)``:

- ``one-zone``: the 4 machines of r1-a;
- ``two-zones``: 2 of r1-a and the 2 of r1-b;
- ``two-regions``: 2 of r1-a and the 2 of r2-a;
- ``auto``: not pinned; the log keeps gpulayer's placement reason and the workers it chose.

Runs alternate (the cases in that order per repeat, one unmeasured warm-up of each first); the figure
is the median of ``--repeats`` of the wall time of ``fit()`` in the client (as in ``scaling.py``). As
there, the results file is rewritten after every run and a failed run is run once more.

    python benchmarks/lightning_comparison/locality_run.py [--repeats 5] [--images 4096]

Writes ``benchmarks/results/<date>-<host>/locality.txt`` with one line per case
``result {"bench": "locality", "case": ..., "wall_s": median, "runs": [...], "placement": "reason"}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from scaling import (  # same folder
    add_job_arguments, counting_zone_bytes, describe_job, describe_layout, job_args, open_lab, result_line,
    run_gpulayer, run_twice_at_most, start_cluster,
)
from common import unwind_on_signals, write_results  # benchmarks/, put on sys.path by scaling
from startup import Report, header, stop_fleet, wait_slots_free

LOCALITY_LAYOUT = {"r1": {"r1-a": 4, "r1-b": 2}, "r2": {"r2-a": 2}}
NODES = 4
CASES = ("one-zone", "two-zones", "two-regions", "auto")


def pinned_machines(machines) -> dict[str, list | None]:
    """The machines each case is pinned to (``None``: gpulayer chooses)."""
    def zone(name):
        return [m for m in machines if m.zone == name]

    a, b, c = zone("r1-a"), zone("r1-b"), zone("r2-a")
    return {"one-zone": a[:4], "two-zones": a[:2] + b[:2], "two-regions": a[:2] + c[:2], "auto": None}


def run_one(lab, fleet, pinned: list | None, job: list[str], workdir: Path, tag: str, out: Report) -> dict:
    def fit():
        return run_gpulayer(fleet, pinned, NODES, "auto", job, workdir, tag)

    return run_twice_at_most(lambda: counting_zone_bytes(lab, fit), out, tag)


def benchmark(args: argparse.Namespace) -> list[str]:
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore

    out = Report()
    header(out, "lightning_comparison/locality_run.py")
    out(f"# job: {describe_job(args)}; Trainer(num_nodes={NODES}, devices=2), grad_sync auto")
    out(f"# repeats {args.repeats} (+{args.warmup} warm-up per case), order per repeat: {', '.join(CASES)}")
    workdir, job = Path(tempfile.mkdtemp(prefix="gl-locality-")), job_args(args)
    runs: dict[str, list[dict]] = {c: [] for c in CASES}
    lab = fleet = None
    try:
        lab, network = open_lab(LOCALITY_LAYOUT)
        out(f"# lab: {network}; {describe_layout(lab.machines)}")
        fleet = start_cluster(lab, workdir)
        store = GangStore(redis_client())
        cases = pinned_machines(lab.machines)
        for w in range(args.warmup):
            for case in CASES:
                run_one(lab, fleet, cases[case], job, workdir, f"warmup{w}-{case}", out)
                wait_slots_free(store)
        out()
        out(f"{'run':>3}  {'case':<12} {'wall s':>7} {'step ms':>8} {'x-zone MB':>9} {'load':>5}  workers  placement")
        for r in range(args.repeats):
            for case in CASES:
                row = run_one(lab, fleet, cases[case], job, workdir, f"r{r}-{case}", out)
                wait_slots_free(store)
                if row is None:
                    continue
                runs[case].append(row)
                out(f"{r + 1:>3}  {case:<12} {row['wall_s']:>7.2f} {row['step_ms']:>8.1f} "
                    f"{row['between_zones_mb']:>9.1f} {os.getloadavg()[0]:>5.1f}  {','.join(row['workers'])}  "
                    f"{row['placement']}")
                write_results([*out.lines, "# partial: still running", *summary_lines(runs)], args.out)
    except Exception as err:  # keep what was measured; the log says where it stopped
        out(f"# STOPPED by {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    finally:
        if fleet is not None:
            stop_fleet(fleet)
        if lab is not None:
            lab.close()
        shutil.rmtree(workdir, ignore_errors=True)
    for line in ["", *summary_lines(runs)]:
        out(line)
    out(f"# load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return out.lines


def summary_lines(runs: dict[str, list[dict]]) -> list[str]:
    """Medians per case (cases with a run), the two-regions / one-zone ratio, one ``result`` line per case."""
    med = {c: {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "step_ms", "loss")}
           for c, rows in runs.items() if rows}
    lines = [f"{'case':<12} {'wall s':>7} {'step ms':>8} {'loss':>7} {'vs one-zone':>11}  placement (last run)"]
    base = med.get("one-zone", {}).get("wall_s")
    for case, m in med.items():
        ratio = f"{m['wall_s'] / base:>10.2f}x" if base else f"{'-':>11}"
        lines.append(f"{case:<12} {m['wall_s']:>7.2f} {m['step_ms']:>8.1f} {m['loss']:>7.4f} {ratio}  "
                     f"{runs[case][-1]['placement']}")
    if base and "two-regions" in med:
        ratio = med["two-regions"]["wall_s"] / base
        verdict = "met" if ratio >= 1.1 else "NOT met"
        lines.append(f"two-regions / one-zone wall: {ratio:.2f}x (goal >= 1.1x: {verdict})")
    for case, m in med.items():
        rows = runs[case]
        lines.append(result_line("locality", case=case, wall_s=round(m["wall_s"], 3),
                                 runs=[round(r["wall_s"], 3) for r in rows], placement=rows[-1]["placement"],
                                 workers=rows[-1]["workers"], step_ms=round(m["step_ms"], 2),
                                 loss=round(m["loss"], 5)))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs per case; medians are quoted (default 5)")
    add_job_arguments(p)
    p.add_argument("--out", default="locality.txt", help="results file name (default locality.txt)")
    args = p.parse_args(argv)
    unwind_on_signals()
    lines = benchmark(args)
    print(f"\nwritten to {write_results(lines, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
