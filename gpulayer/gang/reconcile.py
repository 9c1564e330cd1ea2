"""After a broker failover: a worker re-asserts its gang nodes and slots on the new primary.

The new primary may lack the old one's last writes (``store/reconcile.py``). A gang node running on this
worker keeps running when its gang's record on the new primary still says so; when the record was lost (gone,
or back to waiting because the reservation was lost), the record is put back as this attempt's and the node
fails fast with :data:`~gpulayer.gang.audit.RECORD_LOST`, so the attempt ends and the gang restarts under
``max_restarts`` as after any failure. (``gang/audit.py`` then fails the nodes that no worker claims.)
"""

from __future__ import annotations

import json
import logging
import time

from ..models import GangState
from ..store import keys
from ..store import reconcile as rec
from ..store.gangs import GangStore
from . import agent
from .audit import KIND, RECORD_LOST

log = logging.getLogger(__name__)

def reassert_worker(client, worker_id: str, epoch: str) -> int:
    """Re-assert on the primary ``epoch`` names what this worker runs: its gang nodes' records, its ledger
    entry and claims; returns the slots its entry now holds. Called by the heartbeat on a new primary."""
    store = GangStore(client)
    with agent.runs.lock:
        running = [r for r in agent.runs.running.values() if not r.ended.is_set()]
        for run in running:
            check_record(store, run)
        held = sum(r.spec.procs_per_node for r in agent.runs.running.values())
        return rec.reassert(client, worker_id, epoch, held, list(agent.runs.running), list(agent.runs.taken))


def check_record(store: GangStore, run) -> bool:
    """Whether ``run``'s gang record was lost; if so it is put back as this attempt's and the node fails fast."""
    state, attempt = store.r.hmget(keys.gang(run.gang_id), "state", "attempt")
    attempt = int(attempt or 0)
    lost = (state is None or (state == GangState.WAITING.value.encode() and attempt <= run.attempt)
            or (state == GangState.RUNNING.value.encode() and attempt < run.attempt))
    if not lost:
        return False
    restore(store, run)
    if not store.r.exists(keys.gang_payload(run.gang_id)):
        store.finish(run.gang_id, GangState.FAILED, "broker failed over; gang record lost with its payload, so it "
                                                    "cannot restart; submit it again")
    log.warning("gpulayer reconcile: gang %s attempt %d lost its record in the broker failover; its node %d "
                "fails so the gang restarts", run.gang_id, run.attempt, run.node)
    run.abort(RECORD_LOST, kind=KIND)
    return True


def restore(store: GangStore, run) -> None:
    """The gang's record as this attempt's: running, where the order placed it (the attempt can then end)."""
    key = keys.gang(run.gang_id)
    order = run.order
    placement = {"workers": list(order["workers"]), "addresses": list(order["addresses"]), "hosts": [],
                 "reason": "restored after a broker failover"}
    now = time.time()
    pipe = store.r.pipeline()
    pipe.hsetnx(key, "spec", run.spec.model_dump_json())
    pipe.hsetnx(key, "created", now)
    pipe.hset(key, mapping={"state": GangState.RUNNING.value, "attempt": run.attempt, "reason": RECORD_LOST,
                            "reserved_attempt": run.attempt, "placement": json.dumps(placement)})
    pipe.zadd(keys.GANGS, {run.gang_id: now}, nx=True)
    pipe.zrem(keys.GANGS_WAITING, run.gang_id)
    pipe.execute()
