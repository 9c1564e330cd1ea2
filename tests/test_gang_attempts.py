"""A gang's attempts (``gpulayer/gang/attempts.py``): a dead worker's node, and the failure that names it.

Pure units over stand-ins for the gang store and the registry; the real thing, a worker SIGKILLed mid-fit,
is ``tests/trainer/test_fault_tolerance.py``.
"""

from __future__ import annotations

from gpulayer.errors import GangFailed
from gpulayer.gang import attempts
from gpulayer.models import GangPlacement


class Store:
    def __init__(self, reported):
        self.reported = reported

    def nodes(self, gang_id, attempt):
        return {n: {"worker": f"w{n}"} for n in self.reported}


class Registry:
    dead_after = 5.0

    def __init__(self, ages):
        self._ages = ages
        self.asked = []

    def ages(self, ids):
        self.asked.append(list(ids))
        return {w: self._ages[w] for w in ids if w in self._ages}


WORKERS = ["w0", "w1", "w2"]


def test_every_node_reported_nothing_is_lost():
    assert attempts.wait_stopped(Store([0, 1, 2]), Registry({}), "g", 0, WORKERS, timeout=5) == []


def test_a_node_whose_worker_was_buried_is_lost_at_once_and_only_the_missing_are_asked_about():
    reg = Registry({"w0": 0.1, "w2": 0.2})  # w1 is no longer in the registry: a janitor buried it
    assert attempts.wait_stopped(Store([0, 2]), reg, "g", 0, WORKERS, timeout=60) == [(1, "w1")]
    assert reg.asked == [["w1"]]


def test_a_silent_worker_not_yet_buried_is_waited_for_and_lost_at_the_deadline():
    assert attempts.wait_stopped(Store([0]), Registry({"w1": 9.0, "w2": 0.1}), "g", 0, WORKERS,
                                 timeout=0.1) == [(1, "w1")]  # w2 heartbeats: late, not lost


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
