"""After a broker failover: each worker re-asserts its gang nodes and slots, and running gangs are audited.

The new primary may lack the old one's last writes (``store/reconcile.py``). A gang node running on this
worker keeps running when its gang's record on the new primary still says so; when the record was lost (gone,
or back to waiting because the reservation was lost), the record is put back as this attempt's and the node
fails fast with :data:`RECORD_LOST`, so the attempt ends and the gang restarts under ``max_restarts`` as after
any failure. Once the live workers have re-asserted, :func:`audit` fails the nodes of running gangs that no
worker claims (an order or a node's report lost with the old primary), which would otherwise wait forever.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from ..models import GangSpec, GangState
from ..store import keys
from ..store import reconcile as rec
from ..store.gangs import GangStore
from . import agent
from .coordinator import LOCK_MS, _UNLOCK, node_stopped

log = logging.getLogger(__name__)

RECORD_LOST = "broker failed over; gang record lost; restarting"
KIND = "record_lost"  # the failure report's kind: the attempt fails as after a lost worker


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


def audit(client, epoch: str) -> int | None:
    """Fail the nodes of running gangs whose worker re-asserted on ``epoch`` without claiming them and which
    never reported: their order or their report was lost with the old primary. Once per epoch, under the
    coordinator's lock (no gang is placed meanwhile). Returns how many nodes it failed; None when a coordinator
    pass holds the lock (it audits itself before it places)."""
    token = uuid.uuid4().hex
    if not client.set(keys.COORDINATOR_LOCK, token, nx=True, px=LOCK_MS):
        return None
    try:
        return audit_locked(client, epoch)
    finally:
        client.eval(_UNLOCK, 1, keys.COORDINATOR_LOCK, token)


def audit_locked(client, epoch: str) -> int:
    """:func:`audit` for a caller that holds the coordinator's lock (a coordinator pass)."""
    if (client.get(keys.GANGS_AUDITED) or b"").decode() == epoch:
        return 0
    marks, claimed = rec.claims(client)
    store = GangStore(client)
    failed = []
    for gang in store.active():
        placement = gang.get("placement") or {}
        if gang["state"] != GangState.RUNNING.value or "spec" not in gang:
            continue
        gang_id, attempt = gang["gang_id"], gang["attempt"]
        reported = store.nodes(gang_id, attempt)
        for node, worker_id in enumerate(placement.get("workers", [])):
            if node in reported or marks.get(worker_id) != epoch:
                continue  # reported, or its worker has not re-asserted here (the janitor judges it if it died)
            if rec.node_id(gang_id, attempt, node) in claimed.get(worker_id, ()):
                continue
            failed.append((gang_id, attempt, node, worker_id, GangSpec.model_validate(gang["spec"])))
    client.set(keys.GANGS_AUDITED, epoch)
    for gang_id, attempt, node, worker_id, spec in failed:
        log.warning("gpulayer reconcile: gang %s attempt %d node %d: %s runs no such node after the broker "
                    "failover; the attempt fails", gang_id, attempt, node, worker_id)
        store.push_failure(gang_id, attempt, {
            "rank": node * spec.procs_per_node, "worker": worker_id, "address": "", "host": "", "kind": KIND,
            "exit_code": None, "message": f"{RECORD_LOST} (worker {worker_id} runs no node {node} of it)",
            "stderr_tail": "", "at": time.time()})
        # Its worker's ledger entry, re-asserted, holds nothing for it: mark it released without giving back.
        client.hsetnx(keys.gang_attempt(gang_id, attempt, "released"), worker_id, 1)
        node_stopped(client, gang_id, attempt, node, {"worker": worker_id, "state": "lost", "exit_codes": [],
                                                      "stopped_at": None, "finished_at": time.time()})
    return len(failed)
