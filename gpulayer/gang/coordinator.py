"""The gang coordinator: the cluster places waiting gangs, reserves their slots and hands out their ranks.

The coordinator is a Celery task on the control queue (``queues.CONTROL``), which
every worker serves outside its job slots (``gang/consumer.py``); it costs milliseconds
and never holds a slot. Each run is one *pass*: every waiting gang, in order of
arrival (``keys.GANGS_WAITING``), is placed from one registry snapshot and reserved
all at once (``reserve.lua``), or told why it waits. One pass runs at a time
fleet-wide; a pass asked for while one runs is not lost: the running one goes
round again (``keys.COORDINATOR_AGAIN``).

Priorities: the line is ordered by priority (higher first), then arrival; a gang that does
not fit and outranks running gangs preempts the fewest of them that make room
(``gpulayer/preemption.py``, pure): their nodes stop their ranks (SIGTERM, SIGKILL after
``preempt_grace``), and each victim's attempt ends as *preempted*, the gang waiting again
whole, its restarts untouched (``conclude``). The waiting gang is placed when their slots
come back.

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
from ..preemption import Running, choose_victims
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
    running = _RunningGangs(store)
    for gang_id in waiting:
        try:
            if _try_one(store, gang_id, workers, held, now, running):
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


def _try_one(store: GangStore, gang_id: str, workers, held: dict[str, int], now: float,
             running: _RunningGangs | None = None) -> bool:
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
        why = str(waiting)
        if spec.priority > 0 and running is not None:
            why = _preempt_for(store, spec, attempt, workers, held, now, running) or why
        store.set_waiting(gang_id, _after_preemption(rec, why), since=now)
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
    store.set_started(gang_id, now)
    store.send_orders(spec, attempt, placement, app_mod.settings().broker_url)
    store.announce(gang_id, f"placed:{attempt}")
    return True


# -- preemption ----------------------------------------------------------------------------------
class _RunningGangs:
    """The running gangs' records, read once per pass and only if a gang of some priority waits."""

    def __init__(self, store: GangStore):
        self.store = store
        self._records: list[dict] | None = None

    def records(self) -> list[dict]:
        if self._records is None:
            self._records = [r for r in self.store.active()
                             if r["state"] == GangState.RUNNING.value and r.get("placement") and r.get("spec")]
        return self._records

    def stopped(self, gang_ids: list[str]) -> None:
        """This pass preempted ``gang_ids``: a gang tried after it sees them being stopped."""
        for rec in self.records():
            if rec["gang_id"] in gang_ids:
                rec["preempting"] = {"attempt": rec["attempt"]}


def _holds(rec: dict) -> dict[str, int]:
    m = int(rec["spec"]["procs_per_node"])
    out: dict[str, int] = {}
    for worker_id in rec["placement"]["workers"]:
        out[worker_id] = out.get(worker_id, 0) + m
    return out


def _stopping(rec: dict) -> bool:
    mark = rec.get("preempting")
    return bool(mark) and int(mark["attempt"]) == rec["attempt"]


def _preempt_for(store: GangStore, spec: GangSpec, attempt: int, workers, held: dict[str, int], now: float,
                 running: _RunningGangs) -> str | None:
    """Preempt what makes room for ``spec`` (waiting, of priority > 0); the reason it waits now, or None.

    Gangs already being stopped count as gone: their slots are on their way back, so a gang that fits
    once they are stops nobody more. The slots it waits for are promised to it for the rest of the pass
    (added to ``held``): a gang behind it in the line, of lower priority, cannot take them as they come back.
    """
    records = [r for r in running.records() if r["gang_id"] != spec.gang_id]
    stopping = [r for r in records if _stopping(r)]
    after = dict(held)
    for rec in stopping:
        for worker_id, n in _holds(rec).items():
            after[worker_id] = max(0, after.get(worker_id, 0) - n)
    if stopping:
        try:
            placement = place_gang(spec, workers, after)
            _promise(held, placement, spec.procs_per_node)
            return (f"waiting: {', '.join(r['gang_id'] for r in stopping)} "
                    f"{'is' if len(stopping) == 1 else 'are'} being preempted to make room")
        except (GangWaiting, JobRejected):
            pass
    candidates = [Running(id=r["gang_id"], priority=int(r["spec"].get("priority", 0)),
                          started=float(r.get("started", r["created"])), holds=_holds(r),
                          over_share=over_share(r)) for r in records if not _stopping(r)]
    settings = app_mod.settings()
    grace = settings.preempt_grace if settings else 30.0
    min_runtime = settings.preempt_min_runtime if settings else 60.0
    choice = choose_victims(spec, workers, after, candidates, now=now, min_runtime=min_runtime)
    if choice is None:
        return None
    names = []
    for victim in choice.victims:
        reason = f"priority {spec.priority} over {victim.priority}"
        if store.preempt(victim.id, _attempt_of(records, victim.id), spec.gang_id, reason, grace,
                         ran=victim.runtime(now)):
            log.info("gpulayer coordinator: gang %s preempts gang %s (%s), grace %.1f s", spec.gang_id, victim.id,
                     reason, grace)
            names.append(victim.id)
    if not names:
        return None
    running.stopped(names)
    _promise(held, choice.placement, spec.procs_per_node)
    return (f"waiting: preempting {', '.join(names)} (lower priority) to make room; their ranks have "
            f"{grace:g} s to stop")


def _promise(held: dict[str, int], placement, procs: int) -> None:
    """What the rest of the pass sees: the preempting gang's future slots as taken."""
    for worker_id in placement.workers:
        held[worker_id] = held.get(worker_id, 0) + procs


def _attempt_of(records: list[dict], gang_id: str) -> int:
    return next(r["attempt"] for r in records if r["gang_id"] == gang_id)


def over_share(rec: dict) -> float:
    """How far the gang's user is over its share, for the victim order; 0 until fair-share accounting feeds it."""
    return 0.0


def _after_preemption(rec: dict, why: str) -> str:
    """A requeued victim says so while it waits again."""
    last = rec.get("preempted")
    return f"{last}; {why}" if last and rec.get("preemptions") else why


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
        mark = rec.get("preempting")
        if mark and int(mark["attempt"]) == attempt and results < spec.world_size:
            # Stopped for a gang of higher priority: requeued whole, none of its restarts used.
            line = f"preempted by {mark['by']} ({mark['reason']})"
            attempts.ended(entry, "preempted")
            entry["preempted_by"], entry["failure"] = mark["by"], line
            entry["preempted_after"] = float(mark.get("ran", 0.0))  # seconds it had run (>= preempt_min_runtime)
            if spec.workdir is not None:
                entry["restart_from"] = attempts.restart_source(spec.workdir.restart_from, attempt,
                                                                store.restart_files(gang_id, with_archive=False))
            store.add_attempt(gang_id, entry)
            store.restart(gang_id, attempt + 1, f"{line}; waiting to run again", preempted=line)
            return
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
        restart = attempt - rec["preemptions"] < spec.max_restarts  # preempted attempts use up no restart
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
