"""After a broker failover: the nodes of running gangs that no worker claims fail, so their gang can end.

Once the live workers re-asserted on the new primary (``store/reconcile.py``, ``gang/reconcile.py``), a node
of a running gang that never reported and that its worker neither runs nor holds an order for was lost with
the old primary (its order, or its report): nothing would ever end its attempt. It fails with
:data:`RECORD_LOST`, and the gang restarts under ``max_restarts`` as after any failure.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from ..models import GangSpec, GangState
from ..store import keys
from ..store import reconcile as rec
from ..store.gangs import GangStore

log = logging.getLogger(__name__)

RECORD_LOST = "broker failed over; gang record lost; restarting"
KIND = "record_lost"  # the failure report's kind: the attempt fails as after a lost worker


def audit(client, epoch: str, node_stopped: Callable) -> int:
    """Fail the nodes of running gangs whose worker re-asserted on ``epoch`` without claiming them and which
    never reported. Once per epoch, by a caller that holds the coordinator's lock (no gang is placed meanwhile);
    ``node_stopped``: the coordinator's, called for each such node. Returns how many nodes it failed."""
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
        log.warning("gpulayer audit: gang %s attempt %d node %d: %s runs no such node after the broker "
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
