"""A gang's attempts (``gpulayer/gang/attempts.py``): a dead worker's node, and the failure that names it.

Pure units over the attempt's reports; the real thing, a worker SIGKILLed mid-fit,
is ``tests/trainer/test_fault_tolerance.py``.
"""

from __future__ import annotations

from gpulayer.errors import GangFailed
from gpulayer.gang import attempts
from gpulayer.models import GangPlacement


def test_only_nodes_a_janitor_reported_for_a_dead_worker_are_lost():
    nodes = {0: {"worker": "w0", "state": "failed"}, 1: {"worker": "w1", "state": "lost"},
             2: {"worker": "w2", "state": "stopped"}}
    assert attempts.lost_nodes(nodes) == [(1, "w1")]
    assert attempts.lost_nodes({0: {"worker": "w0", "state": "succeeded"}}) == []


def test_the_attempts_error_names_a_lost_worker_over_the_peer_that_lost_its_connection():
    peer = {"rank": 0, "worker": "w0", "address": "127.0.0.1", "kind": "exception", "type": "RuntimeError",
            "message": "Connection closed by peer", "traceback": "tb"}
    lost = {0: {"worker": "w0", "state": "failed"}, 1: {"worker": "w1", "state": "lost"}}
    err = attempts.failure("g", [peer], lost, procs_per_node=2)
    assert err.type_name == "WorkerLost" and err.rank == 2 and err.worker == "w1"
    plain = attempts.failure("g", [peer], {0: {"worker": "w0", "state": "failed"}}, procs_per_node=2)
    assert plain.type_name == "RuntimeError" and plain.rank == 0
    assert attempts.failure("g", [], lost, procs_per_node=2) is None


def test_the_failure_names_the_lost_worker_and_its_node_first_rank():
    first = GangFailed("RuntimeError", "rank 0 on w0 (127.0.0.1) failed: Connection closed by peer", "tb",
                       job_id="g", worker="w0")
    first.rank = 0
    err = attempts.naming_lost(first, [(1, "w1")], procs_per_node=2)
    assert err.type_name == "WorkerLost" and (err.rank, err.worker, err.traceback) == (2, "w1", "tb")
    assert err.message.startswith("worker w1 (node 1) stopped heartbeating mid-attempt; first report: rank 0 on w0")
    entry = attempts.record(0, GangPlacement(workers=["w0", "w1"], addresses=["a", "b"], reason="placed on 2"))
    attempts.ended(entry, "failed", err, [(1, "w1")])
    assert entry == {"attempt": 0, "workers": ["w0", "w1"], "placement": "placed on 2", "outcome": "failed",
                     "failure": err.message, "failed_rank": 2, "lost_workers": ["w1"]}
