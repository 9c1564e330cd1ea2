"""The attempts of a gang: where each ran and how it ended, and the nodes whose worker died.

Each node reports once its ranks have stopped; a node whose worker died never
does. Such a node counts as stopped once a janitor has buried its worker
(``worker/janitor.py``): from then on no registry snapshot holds that worker,
so a restart (``distributed(max_restarts=K)``) is placed on live workers only,
and the failure names the worker that was lost rather than the rank that
merely lost its connection to it.
"""

from __future__ import annotations

import time

from ..errors import GangFailed
from ..models import GangPlacement
from ..store.gangs import GangStore
from ..store.registry import Registry

POLL = 0.02  # seconds between looks at the node reports and the lost workers' heartbeats


def record(attempt: int, placement: GangPlacement) -> dict:
    """A new attempt's entry in ``GangHandle.attempts``; ``ended`` fills in how it ended."""
    return {"attempt": attempt, "workers": list(placement.workers), "placement": placement.reason,
            "outcome": "running", "failure": None, "failed_rank": None, "lost_workers": []}


def ended(entry: dict, outcome: str, error: GangFailed | None = None, lost: list[tuple[int, str]] = ()) -> None:
    entry["outcome"] = outcome
    if error is not None:
        entry["failure"], entry["failed_rank"] = error.message, getattr(error, "rank", None)
    entry["lost_workers"] = [w for _, w in lost]


def wait_stopped(store: GangStore, registry: Registry, gang_id: str, attempt: int, workers: list[str],
                 timeout: float) -> list[tuple[int, str]]:
    """Wait until every node reported its ranks stopped, or its worker was buried; the ``(node, worker)`` lost.

    At the deadline, a node still silent counts as lost only if its worker is past ``dead_after`` too.
    """
    deadline = time.monotonic() + timeout
    while True:
        reported = store.nodes(gang_id, attempt)
        missing = [(node, w) for node, w in enumerate(workers) if node not in reported]
        if not missing:
            return []
        ages = registry.ages([w for _, w in missing])
        if all(w not in ages for _, w in missing):
            return missing
        if time.monotonic() > deadline:
            return [(node, w) for node, w in missing if ages.get(w, registry.dead_after + 1) > registry.dead_after]
        time.sleep(POLL)


def naming_lost(error: GangFailed, lost: list[tuple[int, str]], procs_per_node: int) -> GangFailed:
    """The attempt's failure, told as what caused it: the worker(s) that died (the first report follows)."""
    node, worker = lost[0]
    who = ", ".join(f"worker {w} (node {n})" for n, w in lost)
    err = GangFailed("WorkerLost", f"{who} stopped heartbeating mid-attempt; first report: {error.message}",
                     error.traceback, job_id=error.job_id, worker=worker)
    err.rank, err.exit_code = node * procs_per_node, None  # the lost node's first rank, as the agents report it
    return err
