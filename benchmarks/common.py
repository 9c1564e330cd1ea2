"""What every benchmark script shares: where results go, the ``result {json}`` line, and how Ctrl-C / SIGTERM unwind."""

from __future__ import annotations

import datetime as dt
import os
import json
import signal
import socket
from pathlib import Path


def write_results(lines: list[str], name: str) -> Path:
    """Write ``lines`` to ``benchmarks/results/<date>-<host>/<name>``; returns the path.

    ``BENCH_RESULTS_DIR``, when set, is the folder instead (``benchmarks/smoke.sh`` points it at a
    temporary one, so a smoke run leaves nothing in ``results/``).
    """
    folder = (Path(os.environ["BENCH_RESULTS_DIR"]) if os.environ.get("BENCH_RESULTS_DIR")
              else Path(__file__).resolve().parent / "results" / f"{dt.date.today().isoformat()}-{socket.gethostname()}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def unwind_on_signals() -> None:
    """Ctrl-C and SIGTERM unwind through the finally blocks that stop every process by pid.

    SIGINT is reset because a shell may start a background job with it ignored.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)


def result_line(bench: str, case: str, **numbers) -> str:
    """One figure as ``result {json}``: the machine-readable line that ``scripts/make_perf_charts.py`` reads.

    ``bench`` names the benchmark, ``case`` the side or variant measured; ``numbers`` carry the figures
    (units in the key: ``wall_s``, ``median_ms``, ``jobs_s``), in the order given (a nested dict keeps its order too).
    """
    return "result " + json.dumps({"bench": bench, "case": case, **numbers})


class Report:
    """Prints each line and keeps it for the results file; ``result(case, **numbers)`` adds the line
    ``result {"bench": ..., "case": ..., ...}`` that ``scripts/make_perf_charts.py`` reads."""

    def __init__(self, bench: str):
        self.bench = bench
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def result(self, case: str, **numbers) -> None:
        import os

        numbers = {k: round(v, 4) if isinstance(v, float) else v for k, v in numbers.items()}
        self(result_line(self.bench, case, **numbers, load=round(os.getloadavg()[0], 1)))


REDIS_NICE = -10


def redis_on_its_own_machine(fleet) -> None:
    """Raise the priority of ``fleet``'s Redis (nice -10) for a lab of simulated machines.

    Redis stands for a server of its own; on this host it shares the cores with every simulated
    machine, and its fair share falls as they grow (30 of them starting 32 ranks reach load 50 and
    more). A higher priority gives it what its own machine would: the CPU when it has work. (The
    false death verdicts at 16 x 2 were the heartbeat waiting behind the janitor's connection,
    fixed in the worker; see docs/PERFORMANCE.md.)
    """
    os.setpriority(os.PRIO_PROCESS, fleet.redis_proc.pid, REDIS_NICE)
