"""One training job on 2, 4 and 8 simulated machines x 2 processes: gpulayer against Lightning + torchrun.

Machines are network namespaces (``open_lab``), each running one ``gpulayer worker`` with 2 slots;
Redis listens on the lab's bridge in the root namespace. The job is ``scaling_run.py``'s CNN (2 epochs,
global batch 256 split over the 2 N processes, ``--images`` synthetic images), run three ways:

- ``gpulayer-two-level`` / ``gpulayer-flat``: one ``Trainer(num_nodes=N, devices=2, grad_sync=...)``
  ``.fit`` from a client process in the root namespace, pinned (``worker_ids``) to the same N machines
  Lightning gets. Wall time: the ``fit()`` call in the client, from submission until it has returned with
  rank 0's weights (placement, rank start from the workers' warm templates, the training, every rank's
  exit and the result's trip back through Redis). The client's own interpreter start and imports are
  logged apart (``client_s``: the client process's whole life).
- ``lightning``: Lightning 2.6.6 ``Trainer(num_nodes=N, devices=2, strategy="ddp")``, one ``torchrun``
  per machine started inside its namespace (``ip netns exec``), node 0's address as the master. Wall
  time: from starting the N torchruns until the last has exited (interpreters, imports, rendezvous,
  training, teardown).

Both: ``OMP_NUM_THREADS=1`` per rank, gloo. Runs alternate (two-level, flat, lightning) per machine
count, repeat after repeat (so a sweep cut short still covers every count); the figure is the median
of ``--repeats``; one unmeasured warm-up of each case comes first. The results file is rewritten after
every run (marked partial until the end). A run that fails is run once more (the log says so); one
whose processes would not fit in the machine's available memory is skipped after waiting 3 minutes.
``step_ms``: rank 0's first to last training step over the steps in between (no start-up in it);
``1st step s``: from the launch (the client process's start for gpulayer, the torchruns' for Lightning)
until rank 0's first step; ``x-zone MB``: what the lab's machines sent through its cross-zone and
cross-region classes during the run (``tc -s class show``).

    python benchmarks/lightning_comparison/scaling.py [--machines 2,4,8] [--repeats 3] [--images 4096]

Writes ``benchmarks/results/<date>-<host>/scaling.txt``: tables, every raw run, and one line per figure
``result {"bench": "scaling", "case": ..., "machines": N, "wall_s": median, "runs": [...], "loss": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: common.py, startup.py

from common import redis_on_its_own_machine, unwind_on_signals, write_results  # noqa: E402
from startup import Report, header, stop_fleet, wait_slots_free  # noqa: E402

RUN_SCRIPT = str(HERE / "scaling_run.py")
CASES = ("gpulayer-two-level", "gpulayer-flat", "lightning")
GRAD_SYNC = {"gpulayer-two-level": "two_level", "gpulayer-flat": "flat"}
# The scaling lab: one region, two zones of 4 machines; a job of N machines takes N/2 from each zone,
# so every job's gradients cross a zone link.
SCALING_LAYOUT = {"r1": {"z1": 4, "z2": 4}}
WORKER_READY_TIMEOUT = 240.0
RUN_TIMEOUT = 600.0


# -- simulated machines ------------------------------------------------------------------------------
def open_lab(layout: dict[str, dict[str, int]]):
    """Start the lab for ``layout`` (``{region: {zone: machines}}``); returns ``(lab, network)``.

    The one place that knows how machines are made: ``gpulayer.lab.netns.NetnsLab`` with its default shaping
    (``network`` describes it for the log); ``lab.machines`` lists them in layout order. The caller closes it.
    """
    from gpulayer.lab.netns import NetnsLab, Shaping, Topology

    shaping = Shaping()
    lab = NetnsLab(Topology(layout), shaping=shaping).start()
    return lab, f"network namespaces on one veth bridge (gpulayer.lab.netns), {shaping.describe()}"


def describe_layout(machines) -> str:
    by_place: dict[tuple[str, str], list[str]] = {}
    for m in machines:
        by_place.setdefault((m.region, m.zone), []).append(m.name)
    return "; ".join(f"{r}/{z}: {','.join(names)}" for (r, z), names in by_place.items())


def sent_between_zones(lab, machines) -> int:
    """Bytes ``machines`` have sent so far through the lab's cross-zone and cross-region classes."""
    return sum(b["cross-zone"] + b["cross-region"] for b in (lab.class_bytes(m.index) for m in machines))


def start_cluster(lab, workdir: Path):
    """Redis on the lab's bridge and one worker (2 slots, OMP_NUM_THREADS=1) per machine; returns the Fleet."""
    from gpulayer.lab.fleet import Fleet

    from scaling_run import DEVICES

    fleet = Fleet(workdir / "fleet", bind=f"127.0.0.1 {lab.host_address}", host=lab.host_address)
    fleet.start_redis()
    redis_on_its_own_machine(fleet)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for m in lab.machines:
        # tie_to_parent: the workers die with this process even if it is SIGKILLed.
        fleet.add_worker(m.name, slots=DEVICES, zone=m.zone, region=m.region, prefix=lab.prefix(m.index),
                         advertise_addr=m.address, env=env, tie_to_parent=True, wait=False)
    fleet.wait_workers([m.name for m in lab.machines], timeout=WORKER_READY_TIMEOUT)
    fleet.connect()
    return fleet


# -- one run of each kind ----------------------------------------------------------------------------
def run_processes(cmds: list[list[str]], logs: list[Path], env: dict[str, str], what: str) -> float:
    """Start every command (own session, output to its log) and wait until all have exited; seconds taken.

    A command that fails, or the run outliving ``RUN_TIMEOUT``, stops them all (by process group) and raises
    with the logs' tails.
    """
    from gpulayer.procs.stop import stop_group

    procs: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    try:
        for cmd, log in zip(cmds, logs):
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=env, start_new_session=True))
        while (codes := [p.poll() for p in procs]).count(0) < len(procs):
            if any(c not in (None, 0) for c in codes) or time.perf_counter() - t0 > RUN_TIMEOUT:
                raise RuntimeError(f"{what}: exit codes {codes} (None: still running after "
                                   f"{time.perf_counter() - t0:.0f} s)\n" +
                                   "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}"
                                             for log in logs))
            time.sleep(0.01)
        return time.perf_counter() - t0
    finally:
        stop_group([p for p in procs if p.poll() is None])


def _stats(path: Path, launched_at: float) -> dict:
    s = json.loads(path.read_text())
    steps = s["steps"]
    return {"steps": steps, "loss": s["eval_loss"], "last_loss": s["last_loss"],
            "step_ms": 1000 * (s["last_step_at"] - s["first_step_at"]) / max(1, steps - 1),
            "first_step_s": s["first_step_at"] - launched_at}


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The job's size and the warm-up, shared by ``scaling.py`` and ``locality_run.py``."""
    p.add_argument("--images", type=int, default=4096, help="synthetic images in the data set (default 4096)")
    p.add_argument("--hidden", type=int, default=0,
                   help="scaling_run.py --hidden: a hidden layer of this width (default 0: the 25,578-parameter CNN)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured runs per case first (default 1)")


def job_args(args: argparse.Namespace) -> list[str]:
    """The job's size, as ``scaling_run.py`` arguments (the same for every run of a sweep)."""
    return ["--images", str(args.images), "--hidden", str(args.hidden)]


def run_gpulayer(fleet, machines: list | None, nodes: int, grad_sync: str, job: list[str], workdir: Path,
                 tag: str) -> dict:
    """One client process: ``fit`` on ``machines`` (pinned) or wherever gpulayer places it (``None``)."""
    stats, log = workdir / f"{tag}.json", workdir / f"{tag}.log"
    cmd = [sys.executable, RUN_SCRIPT, "--framework", "gpulayer", "--machines", str(nodes), *job,
           "--grad-sync", grad_sync, "--stats", str(stats)]
    if machines is not None:
        cmd += ["--workers", ",".join(m.name for m in machines)]
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret, OMP_NUM_THREADS="1")
    launched_at = time.time()
    client_s = run_processes([cmd], [log], env, f"gpulayer client ({tag})")
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("client ")]
    if not lines:
        raise RuntimeError(f"gpulayer client ({tag}) printed no result line:\n{log.read_text()[-2000:]}")
    client = json.loads(lines[-1].removeprefix("client "))
    return {"wall_s": client["fit_s"], "client_s": client_s, "placement": client["placement"],
            "workers": client["workers"], "grad_sync": client["grad_sync"], **_stats(stats, launched_at)}


def run_lightning(lab, machines, job: list[str], workdir: Path, tag: str) -> dict:
    """One torchrun per machine inside its namespace; wall time until the last has exited."""
    from gpulayer.procs.env import torchrun_command

    from scaling_run import DEVICES

    n, stats = len(machines), workdir / f"{tag}.json"
    port = random.randrange(20000, 60000)  # node 0's namespace is fresh: nothing else listens there
    target = [RUN_SCRIPT, "--framework", "lightning", "--machines", str(n), *job, "--stats", str(stats)]
    # Each namespace's hostname resolves to loopback; gloo must use the machine's own interface.
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0")
    cmds = [[*lab.prefix(m.index), *torchrun_command(n, DEVICES, i, machines[0].address, port, target, run_id=tag,
                                          log_dir=str(workdir / f"{tag}-torchrun{i}"))]
            for i, m in enumerate(machines)]
    launched_at = time.time()
    wall = run_processes(cmds, [workdir / f"{tag}-node{i}.log" for i in range(n)], env, f"lightning ({tag})")
    return {"wall_s": wall, **_stats(stats, launched_at)}


# -- the sweep ---------------------------------------------------------------------------------------
def pick_machines(machines: list, n: int) -> list:
    """``n`` machines taken in turn from each zone (node 0 from the first zone)."""
    zones: dict[str, list] = {}
    for m in machines:
        zones.setdefault(m.zone, []).append(m)
    interleaved = [m for group in zip(*zones.values()) for m in group]
    if n > len(interleaved):
        raise SystemExit(f"--machines {n}: the lab has {len(interleaved)} machines to interleave across zones")
    return interleaved[:n]


def counting_zone_bytes(lab, run: Callable[[], dict]) -> dict:
    """``run()``'s row, with the MB every machine of the lab sent to other zones and regions meanwhile."""
    before = sent_between_zones(lab, lab.machines)
    row = run()
    return {**row, "between_zones_mb": (sent_between_zones(lab, lab.machines) - before) / 1e6}


def run_case(case: str, lab, fleet, chosen: list, job: list[str], workdir: Path, tag: str) -> dict:
    if case == "lightning":
        return counting_zone_bytes(lab, lambda: run_lightning(lab, chosen, job, workdir, tag))
    return counting_zone_bytes(
        lab, lambda: run_gpulayer(fleet, chosen, len(chosen), GRAD_SYNC[case], job, workdir, tag))


def describe_job(args: argparse.Namespace) -> str:
    from scaling_run import DEVICES, EPOCHS, GLOBAL_BATCH, parameter_count

    params = parameter_count(args.hidden)
    return (f"scaling_run.py CNN (--hidden {args.hidden}: {params:,} parameters, {4 * params / 1e6:.1f} MB of "
            f"gradients per step), {args.images} synthetic images, {EPOCHS} epochs, global batch {GLOBAL_BATCH}, "
            f"{DEVICES} processes per machine, gloo, OMP_NUM_THREADS=1")


def result_line(bench: str, **fields) -> str:
    """One figure for the charts: ``result`` and a JSON object."""
    return "result " + json.dumps({"bench": bench, **fields})


def benchmark(args: argparse.Namespace) -> list[str]:
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore

    import lightning

    out = Report()
    header(out, "lightning_comparison/scaling.py")
    out(f"# lightning {lightning.__version__}; job: {describe_job(args)}")
    out(f"# machines {args.machines}, repeats {args.repeats} (+{args.warmup} warm-up per case), order per repeat: "
        f"{', '.join(CASES)}")
    workdir, job = Path(tempfile.mkdtemp(prefix="gl-scaling-")), job_args(args)
    runs: dict[tuple[str, int], list[dict]] = {}
    lab = fleet = None
    try:
        lab, network = open_lab(SCALING_LAYOUT)
        machines = lab.machines
        out(f"# lab: {network}; {describe_layout(machines)}")
        fleet = start_cluster(lab, workdir)
        store = GangStore(redis_client())
        first = pick_machines(machines, min(args.machines))
        for w in range(args.warmup):
            for case in CASES:
                tag = f"warmup{w}-{case}"
                run_twice_at_most(lambda: run_case(case, lab, fleet, first, job, workdir, tag), out, tag)
                wait_slots_free(store)
        out()
        out(f"{'N':>2} {'run':>3}  {'case':<19} {'wall s':>7} {'step ms':>8} {'1st step s':>10} {'loss':>7} "
            f"{'x-zone MB':>9} {'load':>5}  machines")
        for r in range(args.repeats):  # repeat-major: a sweep cut short still has every count
            for n in args.machines:
                chosen = pick_machines(machines, n)
                for case in CASES:
                    tag = f"n{n}-r{r}-{case}"
                    if not enough_memory(case, n, out, tag):
                        continue
                    row = run_twice_at_most(lambda: run_case(case, lab, fleet, chosen, job, workdir, tag), out, tag)
                    wait_slots_free(store)
                    if row is None:
                        continue
                    runs.setdefault((case, n), []).append(row)
                    client = f"  (client {row['client_s']:.2f} s, {row['grad_sync']})" if "client_s" in row else ""
                    out(f"{n:>2} {r + 1:>3}  {case:<19} {row['wall_s']:>7.2f} {row['step_ms']:>8.1f} "
                        f"{row['first_step_s']:>10.2f} {row['loss']:>7.4f} {row['between_zones_mb']:>9.1f} "
                        f"{os.getloadavg()[0]:>5.1f}  {','.join(m.name for m in chosen)}{client}")
                    write_results([*out.lines, "# partial: the sweep is still running", *summary_lines(runs, args)],
                                  args.out)
    except Exception as err:  # keep what was measured; the log says where it stopped
        out(f"# STOPPED by {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    finally:
        if fleet is not None:
            stop_fleet(fleet)
        if lab is not None:
            lab.close()
        shutil.rmtree(workdir, ignore_errors=True)
    for line in ["", *summary_lines(runs, args)]:
        out(line)
    out(f"# load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return out.lines


def run_twice_at_most(run: Callable[[], dict], out: Report, tag: str) -> dict | None:
    """``run()``; once more if it fails (on a shared machine a worker starved of CPU misses its heartbeats, and
    the OOM killer takes whichever process it likes); None, logged, if it fails twice."""
    for attempt in (1, 2):
        try:
            return run()
        except RuntimeError as err:
            lines = [ln for ln in str(err).splitlines() if ln.strip() and not ln.startswith((" ", "[", "---"))]
            out(f"# {tag} failed (attempt {attempt} of 2): {lines[0]}")
            for line in lines[-4:]:
                out(f"#     {line[:300]}")
    return None


# MB a run needs beyond what the lab already holds, per process (measured RSS less the shared libraries).
MB_PER_PROCESS = {"lightning": 300, "gpulayer": 120}
MEMORY_WAIT_S = 180.0


def enough_memory(case: str, machines: int, out: Report, tag: str) -> bool:
    """Wait (up to ``MEMORY_WAIT_S``) until the machine has the memory the run needs, so a run on a shared
    machine does not wake the OOM killer; False (and a log line) if it never does."""
    need = MB_PER_PROCESS["lightning" if case == "lightning" else "gpulayer"] * machines * 2
    deadline = time.monotonic() + MEMORY_WAIT_S
    while (free := available_mb()) < need:
        if time.monotonic() > deadline:
            out(f"# {tag} skipped: {free} MB available, {need} MB needed")
            return False
        time.sleep(1.0)
    return True


def available_mb() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemAvailable:"))


def summary_lines(runs: dict[tuple[str, int], list[dict]], args: argparse.Namespace) -> list[str]:
    """The medians table, the ratios and one ``result`` line per figure (counts with every case measured)."""
    med = {key: {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "step_ms", "loss", "last_loss")}
           for key, rows in runs.items()}
    lines = ["medians (wall s, step ms, eval loss):",
             f"{'N':>2}  " + "  ".join(f"{c:>26}" for c in CASES) + "  lightning/two-level  flat/two-level (step)"]
    for n in args.machines:
        if not all((c, n) in med for c in CASES):
            continue
        cells = [med[(c, n)] for c in CASES]
        two, flat, light = cells
        lines.append(f"{n:>2}  " + "  ".join(f"{m['wall_s']:>8.2f} {m['step_ms']:>8.1f} {m['loss']:>8.4f}"
                                            for m in cells)
                     + f"  {light['wall_s'] / two['wall_s']:>18.2f}x  {flat['step_ms'] / two['step_ms']:>10.2f}x")
    for (case, n), rows in sorted(runs.items(), key=lambda kv: (kv[0][1], CASES.index(kv[0][0]))):
        m = med[(case, n)]
        lines.append(result_line("scaling", case=case, machines=n, wall_s=round(m["wall_s"], 3),
                                 runs=[round(r["wall_s"], 3) for r in rows], loss=round(m["loss"], 5),
                                 last_loss=round(m["last_loss"], 5), step_ms=round(m["step_ms"], 2),
                                 step_ms_runs=[round(r["step_ms"], 2) for r in rows]))
    return lines


def parse_counts(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",") if x.strip()]
    if not counts or any(c < 1 or c > 8 for c in counts):
        raise argparse.ArgumentTypeError(f"--machines {text!r}: comma-separated counts from 1 to 8")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--machines", type=parse_counts, default=[2, 4, 8], help="machine counts (default 2,4,8)")
    p.add_argument("--repeats", type=int, default=3, help="runs per case and count; medians are quoted (default 3)")
    add_job_arguments(p)
    p.add_argument("--out", default="scaling.txt", help="results file name (default scaling.txt)")
    args = p.parse_args(argv)
    unwind_on_signals()
    lines = benchmark(args)
    print(f"\nwritten to {write_results(lines, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
