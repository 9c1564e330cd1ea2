"""The gang coordinator: the cluster places waiting gangs, reserves their slots and hands out their ranks.

The coordinator is a Celery task on the control queue (``queues.CONTROL``), which
every worker serves outside its job slots (``gang/consumer.py``); it costs milliseconds
and never holds a slot. Each run is one *pass*: every waiting gang, in order of
arrival (``keys.GANGS_WAITING``), is placed from one registry snapshot and reserved
all at once (``reserve.lua``), or told why it waits. One pass runs at a time
fleet-wide; a pass asked for while one runs is not lost: the running one goes
round again (``keys.COORDINATOR_AGAIN``).

Who asks for a pass: the client after it created a gang (a message), a node whose
ranks stopped and gave their slots back (``node_stopped``, directly, in the
worker), the janitor burying a dead worker (``worker_lost``), and each worker's
control consumer once a second fleet-wide while gangs wait (new workers, a
message lost with its worker, timeouts). So a waiting gang is placed, restarted or
timed out by the cluster even when its client has gone away.
"""

from __future__ import annotations

import logging
import time
import uuid

from .. import app as app_mod
from .. import queues
from ..errors import JobRejected
from ..models import GangPlacement, GangSpec, GangState
from ..placement import GangWaiting, place_gang
from ..store import keys
from ..store import reconcile
from ..store.gangs import GangStore
from . import attempts
from .audit import audit

log = logging.getLogger(__name__)

COORDINATE = app_mod.COORDINATE
LOCK_MS = 10_000  # a pass takes milliseconds; a holder that died frees the lock after this
_UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


@app_mod.app.task(name=COORDINATE, ignore_result=True)  # routed to queues.CONTROL (app.route_task)
def coordinate(gang_id: str | None = None, attempt: int | None = None) -> dict:
    """One coordinator pass over every waiting gang (the message names the gang that asked)."""
    client = app_mod.redis_client()
    try:
        return try_waiting(client)
    finally:
        client.close()


def ask(gang_id: str, attempt: int) -> None:
    """Ask the cluster for a pass: a message on the control queue, which some worker takes within milliseconds."""
    coordinate.apply_async((gang_id, attempt), queue=queues.CONTROL, ignore_result=True)


# -- the pass ------------------------------------------------------------------------------------
def try_waiting(client) -> dict:
    """Try every waiting gang in order of arrival, or leave it to the pass under way; never drops a request."""
    if not client.zcard(keys.GANGS_WAITING):  # whoever adds a waiting gang asks for a pass after
        return {"placed": []}
    client.set(keys.COORDINATOR_AGAIN, 1)
    placed: list[str] = []
    while True:
        token = uuid.uuid4().hex
        if not client.set(keys.COORDINATOR_LOCK, token, nx=True, px=LOCK_MS):
            return {"placed": placed, "left_to": "the pass under way"}
        try:
            while client.getdel(keys.COORDINATOR_AGAIN):
                placed += one_pass(client)
        finally:
            client.eval(_UNLOCK, 1, keys.COORDINATOR_LOCK, token)
        if not client.exists(keys.COORDINATOR_AGAIN):  # asked again between our last look and the unlock
            return {"placed": placed}


def one_pass(client) -> list[str]:
    """Place what fits of the waiting gangs, in order of arrival; record why the others wait. Returns the placed."""
    store = GangStore(client, app_mod.write_durability())
    waiting = store.waiting()
    if not waiting:
        return []
    secs, micros = client.time()
    now = secs + micros / 1e6
    workers = app_mod.registry().current()
    workers = reconciled(client, store, waiting, workers, now)
    if workers is None:
        return []
    held = store.held()
    placed = []
    for gang_id in waiting:
        try:
            if _try_one(store, gang_id, workers, held, now):
                placed.append(gang_id)
        except Exception:  # one broken record must not stop the line behind it
            log.exception("gpulayer coordinator: could not try gang %s", gang_id)
    return placed


def reconciled(client, store: GangStore, waiting: list[str], workers, now: float):
    """The workers a pass may place on: after a broker failover, none until every live worker re-asserted its
    slots on the new primary (``store/reconcile.py``), up to ``RECONCILE_WAIT`` seconds; then those that did.
    ``None``: wait (each waiting gang says why), the next pass tries again."""
    epoch = reconcile.primary_epoch(client)
    late = reconcile.late(client, epoch, [w.id for w in workers])
    if late:
        age = reconcile.epoch_age(client, epoch)
        if age < reconcile.RECONCILE_WAIT:
            reason = (f"waiting: the broker failed over {age:.1f} s ago and {len(late)} of {len(workers)} live "
                      f"workers have not re-asserted their slots on the new primary yet ({', '.join(late[:4])}"
                      f"{', ...' if len(late) > 4 else ''}); placing nothing until they have (at most "
                      f"{reconcile.RECONCILE_WAIT:.0f} s)")
            for gang_id in waiting:
                store.set_waiting(gang_id, reason, since=now)
            return None
        log.warning("gpulayer coordinator: %d worker(s) did not re-assert their slots within %.0f s of the "
                    "broker's failover (%s); placing on the others", len(late), reconcile.RECONCILE_WAIT,
                    ", ".join(late[:8]))
        workers = tuple(w for w in workers if w.id not in set(late))
    audit(client, epoch, node_stopped)  # once per primary: nodes lost with the old one fail before anything is placed
    return workers


def audit_after_failover(client, epoch: str) -> int | None:
    """``gang/audit.py``'s audit under the coordinator's lock, for the janitor (a pass audits before it places);
    None when a pass holds the lock."""
    token = uuid.uuid4().hex
    if not client.set(keys.COORDINATOR_LOCK, token, nx=True, px=LOCK_MS):
        return None
    try:
        return audit(client, epoch, node_stopped)
    finally:
        client.eval(_UNLOCK, 1, keys.COORDINATOR_LOCK, token)


def _try_one(store: GangStore, gang_id: str, workers, held: dict[str, int], now: float) -> bool:
    rec = store.record(gang_id)
    if rec["state"] != GangState.WAITING.value or "spec" not in rec:
        store.r.zrem(keys.GANGS_WAITING, gang_id)  # ended meanwhile (cancelled, or its record expired)
        return False
    spec = GangSpec.model_validate(rec["spec"])
    attempt, since = rec["attempt"], rec.get("waiting_since", now)
    if spec.timeout is not None and now - since > spec.timeout:
        store.finish_if_waiting(gang_id, GangState.FAILED,
                                f"distributed job {gang_id} did not fit within {spec.timeout}s: {rec['reason']}")
        return False
    try:
        placement = place_gang(spec, workers, held)
    except GangWaiting as waiting:
        store.set_waiting(gang_id, str(waiting), since=now)
        return False
    except JobRejected as rejected:
        store.finish_if_waiting(gang_id, GangState.FAILED, str(rejected))
        return False
    outcome, short, free = store.reserve(gang_id, attempt, placement, spec.procs_per_node, spec.client,
                                         spec.resources.gpus if spec.resources.cuda else 0)
    if outcome == "quota":  # its user's fair-share quota: it waits, with the reason (docs/FAIRSHARE.md)
        store.set_waiting(gang_id, f"waiting: {short}", since=now)
        return False
    if outcome == "full":
        store.set_waiting(gang_id, f"waiting: {short} has {max(free, 0)} free slots now (taken since the "
                                   "snapshot); retrying", since=now)
        return False
    if outcome != "ok":
        return False
    for worker_id in placement.workers:  # what the rest of this pass sees
        held[worker_id] = held.get(worker_id, 0) + spec.procs_per_node
    store.send_orders(spec, attempt, placement, app_mod.settings().broker_url)
    store.announce(gang_id, f"placed:{attempt}")
    return True


# -- the end of an attempt -----------------------------------------------------------------------
def node_stopped(client, gang_id: str, attempt: int, node: int, report: dict) -> None:
    """A node's ranks stopped and its slots went back: record it; the last node ends the attempt; try the line.

    Called by the gang agent (and the emulator, and ``worker_lost`` for a dead node), after
    ``GangStore.release``, so a client that sees the gang end finds every slot free.
    """
    store = GangStore(client)
    reported = store.node_report(gang_id, attempt, node, report)
    try:
        spec = store.spec(gang_id)
    except KeyError:
        return
    if reported >= spec.nodes and store.claim_conclusion(gang_id, attempt):
        conclude(store, spec, attempt)
    try_waiting(client)


def conclude(store: GangStore, spec: GangSpec, attempt: int) -> None:
    """Every node of the attempt stopped: the gang succeeded, failed, or restarts whole (``max_restarts``)."""
    gang_id = spec.gang_id
    rec = store.record(gang_id)
    try:
        if rec["state"] != GangState.RUNNING.value or rec["attempt"] != attempt:
            return  # cancelled (or ended) while it ran: nothing to decide
        results = store.result_count(gang_id, attempt)
        failures = store.failures(gang_id, attempt)
        entry = attempts.record(attempt, GangPlacement.model_validate(rec["placement"]))
        # Every rank returned and none failed: a worker lost after that (its node never reported) changes nothing.
        if results >= spec.world_size and all(f["kind"] in ("worker_lost", "record_lost") for f in failures):
            attempts.ended(entry, "succeeded")
            store.add_attempt(gang_id, entry)
            store.finish(gang_id, GangState.SUCCEEDED, rec["reason"])
            return
        nodes = store.nodes(gang_id, attempt)
        # Told as what caused it: a worker that died, not a peer that lost its connection to it.
        error = attempts.failure(gang_id, failures, nodes, spec.procs_per_node)
        message = error.message if error is not None else (
            f"every node stopped with {results} of {spec.world_size} rank results and no failure report; "
            "see the workers' logs")
        attempts.ended(entry, "failed", error, attempts.lost_nodes(nodes))
        entry["failure"] = message
        restart = attempt < spec.max_restarts
        if restart and spec.workdir is not None:  # where the next attempt's nodes start (gang/workdir.py)
            entry["restart_from"] = attempts.restart_source(spec.workdir.restart_from, attempt,
                                                            store.restart_files(gang_id, with_archive=False))
        store.add_attempt(gang_id, entry)
        if restart:  # the whole gang again, like torchrun, placed on live workers
            store.restart(gang_id, attempt + 1, f"restarting after: {message}")
        else:
            store.finish(gang_id, GangState.FAILED, message)
    finally:
        store.announce(gang_id, f"stopped:{attempt}")


def forget_previous_life(client, worker_id: str) -> None:
    """A previous life's gang nodes died with it: they fail (their gangs restart or end), then the slate is clean.

    Run by a worker before it registers: a gang placed on this life afterwards is this life's.
    """
    worker_lost(client, worker_id, "its worker restarted")
    GangStore(client).forget_worker(worker_id)


def worker_lost(client, worker_id: str, why: str) -> None:
    """A worker is dead (or restarted): its nodes of running gangs fail and stop, and their slots go back.

    Its peers' agents notice too (``_lost_peer``) and stop their ranks; this is the dead
    node's own report, which no agent is left to write.
    """
    store = GangStore(client)
    for rec in store.active():
        workers = (rec.get("placement") or {}).get("workers", [])
        if rec["state"] != GangState.RUNNING.value or worker_id not in workers:
            continue
        gang_id, attempt = rec["gang_id"], rec["attempt"]
        node = workers.index(worker_id)
        if node in store.nodes(gang_id, attempt):
            continue
        spec = GangSpec.model_validate(rec["spec"])
        addresses = rec["placement"].get("addresses") or []
        store.push_failure(gang_id, attempt, {
            "rank": node * spec.procs_per_node, "worker": worker_id,
            "address": addresses[node] if node < len(addresses) else "", "host": "",
            "kind": "worker_lost", "exit_code": None, "message": f"worker {worker_id} (node {node}) was lost: {why}",
            "stderr_tail": "", "at": time.time()})
        store.release(gang_id, attempt, worker_id, spec.procs_per_node)
        node_stopped(client, gang_id, attempt, node, {"worker": worker_id, "state": "lost", "exit_codes": [],
                                                     "stopped_at": None, "finished_at": time.time()})
