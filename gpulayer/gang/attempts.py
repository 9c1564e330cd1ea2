"""The attempts of a gang: where each ran and how it ended, and the nodes whose worker died.

Each node reports once its ranks have stopped; a node whose worker died never
does. Its report is written when a janitor buries the worker
(``coordinator.worker_lost``): from then on no registry snapshot holds that
worker, so a restart (``distributed(max_restarts=K)``), which waits for every
node's report, is placed on live workers only, and the failure names the worker
that was lost rather than the rank that merely lost its connection to it.
"""

from __future__ import annotations

import json
import signal

from ..errors import GangFailed
from ..models import GangPlacement
from .outcome import gang_failure


def record(attempt: int, placement: GangPlacement) -> dict:
    """A new attempt's entry in ``GangHandle.attempts``; ``ended`` fills in how it ended."""
    return {"attempt": attempt, "workers": list(placement.workers), "placement": placement.reason,
            "outcome": "running", "failure": None, "failed_rank": None, "lost_workers": []}


def ended(entry: dict, outcome: str, error: GangFailed | None = None, lost: list[tuple[int, str]] = ()) -> None:
    entry["outcome"] = outcome
    if error is not None:
        entry["failure"], entry["failed_rank"] = error.message, getattr(error, "rank", None)
        entry["cause"] = cause(error)
    entry["lost_workers"] = [w for _, w in lost]


def cause(error: GangFailed) -> str:
    """The failure in a few words: ``rank 2 on local-2: exit 9``, ``... killed by SIGKILL``, ``... RuntimeError``."""
    code = getattr(error, "exit_code", None)
    if error.type_name == "WorkerLost":
        what = "its worker was lost"
    elif error.type_name not in ("RankExited", "GangFailed"):
        what = error.type_name
    elif isinstance(code, int) and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    elif code is not None:
        what = f"exit {code}"
    else:
        what = "the process died"
    rank = getattr(error, "rank", None)
    who = f"rank {rank}" if rank is not None else "a rank"
    return f"{who} on {error.worker}: {what}" if error.worker else f"{who}: {what}"


def restart_source(restart_from: str | None, attempt: int, node0: dict | None) -> str | None:
    """Where the nodes of the attempt after ``attempt`` start, in a line; None for a gang without a workdir.

    ``node0``: what node 0's agent packed (``GangStore.restart_files``, without the archive).
    A line that starts with ``warning:`` says the restart does not resume as the user asked.
    """
    if restart_from is None:
        return None
    if restart_from == "own":
        return "each node in its own working directory (--restart-from own)"
    if restart_from == "fresh":
        return "every node from a fresh copy of the shipped directory (--restart-from fresh)"
    if node0 is None or int(node0["attempt"]) != attempt:
        return ("warning: node 0's files of this attempt did not survive it (its worker was lost?); each node "
                "resumes in its own working directory, a restart on another worker from the shipped copy")
    if "error" in node0:
        return (f"warning: node 0's files cannot go to the other nodes: {_text(node0['error'])}; each node "
                "resumes in its own working directory, a restart on another worker from the shipped copy")
    n, size = len(json.loads(node0["files"])), int(node0.get("bytes") or 0)
    return f"every node from node 0's files ({n} file{'s' if n != 1 else ''}, {_size(size)}, from {_text(node0['worker'])})"


def announcement(entry: dict, nodes: int, procs_per_node: int, max_restarts: int) -> str:
    """The line the client prints when attempt ``entry`` failed and the gang restarts (attempts count from 1)."""
    number = entry["attempt"] + 1
    if entry.get("outcome") == "preempted":  # requeued whole; its restarts untouched
        line = (f"attempt {number} {entry.get('failure') or 'preempted'}; requeued {nodes} x {procs_per_node} "
                f"(attempt {number + 1}; a preemption uses none of the {max_restarts} restarts)")
    else:
        why = entry.get("cause") or entry.get("failure") or "no failure report"
        line = (f"attempt {number} failed ({why}); restarting {nodes} x {procs_per_node} "
                f"(attempt {number + 1} of {max_restarts + 1})")
    source = entry.get("restart_from")
    if source:
        line += f"; {source}" if source.startswith("warning:") else f", {source}"
    return line


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} bytes"


def lost_nodes(nodes: dict[int, dict]) -> list[tuple[int, str]]:
    """The ``(node, worker)`` of an attempt's node reports that a janitor wrote for a dead worker."""
    return sorted((node, r["worker"]) for node, r in nodes.items() if r.get("state") == "lost")


def failure(gang_id: str, reports: list[dict], nodes: dict[int, dict], procs_per_node: int) -> GangFailed | None:
    """The attempt's error from its failure reports and node reports; None without a failure report."""
    if not reports:
        return None
    error = gang_failure(gang_id, reports)
    lost = lost_nodes(nodes)
    return naming_lost(error, lost, procs_per_node) if lost else error


def naming_lost(error: GangFailed, lost: list[tuple[int, str]], procs_per_node: int) -> GangFailed:
    """The attempt's failure, told as what caused it: the worker(s) that died (the first report follows)."""
    node, worker = lost[0]
    who = ", ".join(f"worker {w} (node {n})" for n, w in lost)
    err = GangFailed("WorkerLost", f"{who} stopped heartbeating mid-attempt; first report: {error.message}",
                     error.traceback, job_id=error.job_id, worker=worker)
    err.rank, err.exit_code = node * procs_per_node, None  # the lost node's first rank, as the agents report it
    return err
