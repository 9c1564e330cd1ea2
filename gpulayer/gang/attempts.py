"""The attempts of a gang: where each ran and how it ended, and the nodes whose worker died.

Each node reports once its ranks have stopped; a node whose worker died never
does. Its report is written when a janitor buries the worker
(``coordinator.worker_lost``): from then on no registry snapshot holds that
worker, so a restart (``distributed(max_restarts=K)``), which waits for every
node's report, is placed on live workers only, and the failure names the worker
that was lost rather than the rank that merely lost its connection to it.
"""

from __future__ import annotations

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
    entry["lost_workers"] = [w for _, w in lost]


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
