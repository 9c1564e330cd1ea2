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
                     "failure": err.message, "failed_rank": 2, "lost_workers": ["w1"],
                     "cause": "rank 2 on w1: its worker was lost"}


def _failed(type_name: str, exit_code, worker="w-b", rank=2) -> dict:
    err = GangFailed(type_name, f"rank {rank} on {worker} (127.0.0.1) failed", job_id="g", worker=worker)
    err.rank, err.exit_code = rank, exit_code
    entry = attempts.record(0, GangPlacement(workers=["w-a", "w-b"], addresses=["a", "b"], reason="placed"))
    attempts.ended(entry, "failed", err)
    return entry


def test_the_cause_of_a_failed_attempt_in_a_few_words():
    assert _failed("RankExited", -9)["cause"] == "rank 2 on w-b: killed by SIGKILL"
    assert _failed("RankExited", 9)["cause"] == "rank 2 on w-b: exit 9"
    assert _failed("RuntimeError", 1)["cause"] == "rank 2 on w-b: RuntimeError"
    assert _failed("WorkerLost", None)["cause"] == "rank 2 on w-b: its worker was lost"


def test_a_restart_is_announced_with_its_cause_and_where_the_nodes_start():
    entry = _failed("RankExited", 9)
    entry["restart_from"] = attempts.restart_source(
        "node0", 0, {"attempt": b"0", "worker": b"w-a", "files": b'[["snapshot.pt", 2048]]', "bytes": b"2048"})
    assert attempts.announcement(entry, 2, 2, max_restarts=1) == (
        "attempt 1 failed (rank 2 on w-b: exit 9); restarting 2 x 2 (attempt 2 of 2), every node from node 0's "
        "files (1 file, 2.0 KiB, from w-a)")
    # Node 0's files over the limit, or lost with their worker: said as a warning, with what happens instead.
    too_big = attempts.restart_source("node0", 0, {"attempt": b"0", "worker": b"w-a",
                                                   "error": b"node 0's ranks wrote 60.0 MiB ... (biggest: a.pt)"})
    assert too_big.startswith("warning: node 0's files cannot go to the other nodes: node 0's ranks wrote 60.0 MiB")
    assert "each node resumes in its own working directory" in too_big
    entry["restart_from"] = attempts.restart_source("node0", 1, {"attempt": b"0", "worker": b"w-a", "files": b"[]"})
    assert attempts.announcement(entry, 2, 2, max_restarts=3).endswith(
        "(attempt 2 of 4); warning: node 0's files of this attempt did not survive it (its worker was lost?); "
        "each node resumes in its own working directory, a restart on another worker from the shipped copy")
    assert "--restart-from own" in attempts.restart_source("own", 0, None)
    assert "--restart-from fresh" in attempts.restart_source("fresh", 0, None)
    assert attempts.restart_source(None, 0, None) is None  # a gang without a working directory
