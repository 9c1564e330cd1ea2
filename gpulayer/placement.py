"""Routing and placement: pure functions over a snapshot of live workers.

A frozen snapshot in, a decision or a reason out. No Redis, no Celery, no
clock: tested in microseconds. Each snapshot is indexed once
(``placement_index.py``), so a decision costs what it looks at, not the fleet.
"""

from __future__ import annotations

import difflib
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from . import queues
from .errors import JobRejected
from .models import GangPlacement, GangSpec, Resources, WorkerInfo
from .placement_index import GangTable, GroupPlan, SnapshotIndex, group_plan, index_for, procs_capacity, request_key

_MAX_LISTED = 6


@dataclass(frozen=True)
class Route:
    """Where a job goes: the queue, and the live workers that read it."""

    queue: str
    eligible: tuple[str, ...]


@dataclass(frozen=True)
class Wording:
    """How a refusal names what its reader can change: the keywords of a Python call (``PYTHON``), or the flags
    of a command line (``FLAGS``, ``gpulayer train``)."""

    nodes: str = "nodes="
    procs_per_node: str = "procs_per_node="
    cuda: str = "cuda=True"


PYTHON = Wording()
FLAGS = Wording(nodes="--nodes", procs_per_node="--procs-per-node", cuda="--cuda")


def eligible_workers(res: Resources, workers: Sequence[WorkerInfo], wording: Wording = PYTHON) -> list[WorkerInfo]:
    """The live workers that satisfy every requirement of ``res``; raise why none does."""
    index = index_for(workers)
    pool = _pinned(res, index) if res.worker_ids else list(index.eligible(request_key(res)))
    return pool or _refuse(res, workers, wording)


def route(res: Resources, workers: Sequence[WorkerInfo]) -> Route:
    """Name the queue for one job needing ``res``, or raise ``JobRejected`` with the reason.

    Pinned jobs go to a private queue (the least busy of the named workers);
    everything else to the shared capability queue that exactly the eligible
    workers read. A lookup in the snapshot's index once it has routed the
    same request.
    """
    index = index_for(workers)
    if res.worker_ids:
        pool = _pinned(res, index) or _refuse(res, workers)
        best = min(pool, key=lambda w: (-w.free, w.id))
        return Route(queues.private(best.id), (best.id,))
    key = request_key(res)
    r = index.routes.get(key)
    if r is None:
        try:
            pool = index.eligible(key) or _refuse(res, workers)
        except JobRejected as err:  # the same request on the same snapshot gets the same answer, at once
            index.routes[key] = str(err)
            raise
        r = index.routes[key] = Route(queues.capability(res.gpus, zone=res.zone, region=res.region),
                                      tuple(w.id for w in pool))
    if isinstance(r, str):
        raise JobRejected(r)
    return r


def _pinned(res: Resources, index: SnapshotIndex) -> list[WorkerInfo]:
    """The named workers meeting ``res``, in the order named; empty when one is unknown or none fits."""
    pool = []
    for i in dict.fromkeys(res.worker_ids):
        w = index.by_id.get(i)
        if w is None:
            return []
        if ((not res.cuda or w.gpus >= res.gpus) and (res.zone is None or w.zone == res.zone)
                and (res.region is None or w.region == res.region)):
            pool.append(w)
    return pool


def _refuse(res: Resources, workers: Sequence[WorkerInfo], wording: Wording = PYTHON) -> list[WorkerInfo]:
    """Filter the whole snapshot step by step to say which requirement no live worker meets.

    Only reached when the index found nobody, so it raises ``JobRejected``; it
    returns the pool only if the index and this disagree (they never should).
    """
    if not workers:
        raise JobRejected(
            f"no live worker for {res.describe()}: the cluster has no live workers; "
            "start one with `gpulayer worker --broker URL` or `gpulayer up`"
        )
    pool = list(workers)
    if res.worker_ids:
        known = {w.id: w for w in pool}
        missing = [i for i in res.worker_ids if i not in known]
        if missing:
            raise JobRejected(
                f"no live worker named {', '.join(map(repr, missing))}"
                f"{_suggest(missing[0], known)}; live workers: {_offer(pool)}"
            )
        pool = [known[i] for i in dict.fromkeys(res.worker_ids)]
    if res.cuda:
        with_gpus = [w for w in pool if w.gpus >= res.gpus]
        if not with_gpus:
            need = "CUDA" if res.gpus <= 1 else f"CUDA with {res.gpus} GPUs"
            scope = "the named workers" if res.worker_ids else "no live worker"
            raise JobRejected(
                f"{scope} {'lack' if res.worker_ids else 'has'} {need} (live: {_offer(pool)}); "
                f"start a worker on a GPU machine or drop {wording.cuda}"
            )
        pool = with_gpus
    if res.zone:
        in_zone = [w for w in pool if w.zone == res.zone]
        if not in_zone:
            raise JobRejected(
                f"no live worker {_with(res)} in zone {res.zone!r}"
                f"{_suggest(res.zone, {w.zone for w in workers if w.zone})} (live: {_offer(pool)}); "
                "check the zone's spelling or start a worker with --zone"
            )
        pool = in_zone
    if res.region:
        in_region = [w for w in pool if w.region == res.region]
        if not in_region:
            raise JobRejected(
                f"no live worker {_with(res)} in region {res.region!r}"
                f"{_suggest(res.region, {w.region for w in workers if w.region})} (live: {_offer(pool)}); "
                "check the region's spelling or start a worker with --region"
            )
        pool = in_region
    return pool


def _with(res: Resources) -> str:
    return "with CUDA" if res.cuda else "(CPU)"


def _offer(workers: Sequence[WorkerInfo]) -> str:
    shown = ", ".join(w.describe() for w in list(workers)[:_MAX_LISTED])
    more = len(workers) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "") if shown else "none"


def _suggest(name: str, known) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.5)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


# --- gangs: N workers x M processes, all or nothing, locality first ---------------------------------


class GangWaiting(Exception):
    """The gang could run on the live fleet, but not now; ``str(self)`` says what it waits for."""


def _gang_candidates(spec: GangSpec, workers: Sequence[WorkerInfo], wording: Wording = PYTHON) -> list[WorkerInfo]:
    """Workers that could ever hold one node of the gang; ``JobRejected`` if too few for all nodes."""
    res, n, m = spec.resources, spec.nodes, spec.procs_per_node
    if res.worker_ids and len(set(res.worker_ids)) < n:
        raise JobRejected(f"a gang of {n} nodes was pinned to only {len(set(res.worker_ids))} workers "
                          f"({', '.join(res.worker_ids)}); name at least {n} workers or lower {wording.nodes}")
    pool = eligible_workers(res, workers, wording)
    able = [w for w in pool if procs_capacity(w, res) >= m]
    if len(able) < n:
        per = f"{m} slots" + (f" and {m * res.gpus} GPUs" if res.cuda else "")
        raise JobRejected(
            f"the gang needs {n} workers with {per} each, but only {len(able)} live worker(s) have that "
            f"(live: {', '.join(f'{w.id} {w.slots} slots' + (f' {w.gpus} GPUs' if w.gpus else '') for w in pool[:_MAX_LISTED])}); "
            f"lower {wording.nodes} or {wording.procs_per_node}, or start more workers")
    return able


def _gang_table(spec: GangSpec, workers: Sequence[WorkerInfo], index: SnapshotIndex,
                wording: Wording = PYTHON) -> GangTable:
    """The indexed candidates of an unpinned gang; ``JobRejected`` (from the full scan) if too few."""
    res = spec.resources
    memo = (request_key(res), spec.nodes, spec.procs_per_node, wording)
    if memo in index.refusals:
        raise JobRejected(index.refusals[memo])
    table = index.gang_table(res, spec.procs_per_node) if index.eligible(memo[0]) else None
    if table is None or len(table.able) < spec.nodes:
        try:
            _gang_candidates(spec, workers, wording)  # raises with the reason
        except JobRejected as err:
            index.refusals[memo] = str(err)
            raise
        raise AssertionError("the snapshot index and the full scan disagree on a gang's candidates")
    return table


def check_gang_fits_fleet(spec: GangSpec, workers: Sequence[WorkerInfo], wording: Wording = PYTHON) -> None:
    """Raise ``JobRejected`` now if the gang can never fit on the live fleet, even with every slot free;
    ``wording``: what the reason calls the fix (``FLAGS`` where the user typed flags)."""
    if spec.resources.worker_ids:
        _gang_candidates(spec, workers, wording)
    else:
        _gang_table(spec, workers, index_for(workers), wording)


def place_gang(spec: GangSpec, workers: Sequence[WorkerInfo], held: dict[str, int]) -> GangPlacement:
    """Choose the gang's workers from a snapshot and the slot ledger (``held``: slots gangs hold per worker).

    All or nothing: either every node gets a worker with ``procs_per_node`` free
    slots, or ``GangWaiting`` says why not. Locality: one zone, else one region,
    else across regions; among equals, fewer hosts, then more free slots.

    Each zone's and region's best pick is remembered in the snapshot's index, and
    only the groups holding a worker named in ``held`` are looked at again.
    """
    res, n, m = spec.resources, spec.nodes, spec.procs_per_node

    def free(w: WorkerInfo) -> int:
        h = held.get(w.id, 0)
        return min(w.slots - w.busy - h, procs_capacity(w, res) - h)

    if res.worker_ids:
        able = _gang_candidates(spec, workers)
        fits = [w for w in able if free(w) >= m]
        if len(fits) < n:
            raise GangWaiting(_waiting(n, m, able, free))
        chosen = _pick(fits, n)
        return _placement(chosen, f"pinned to {', '.join(w.id for w in chosen)}")

    table = _gang_table(spec, workers, index_for(workers))
    fitting = table.base_fits
    # The hosts the ledger holds slots on, per zone and region (and "all" for the whole table).
    touched: dict[str, dict[str | None, set[str]]] = {"zone": {}, "region": {}, "all": {}}
    for wid, h in held.items():
        for w in table.able_by_id.get(wid, ()) if h else ():
            base = min(w.slots - w.busy, procs_capacity(w, res))
            fitting += (free(w) >= m) - (base >= m)
            touched["zone"].setdefault(w.zone, set()).add(w.hostname)
            touched["region"].setdefault(w.region, set()).add(w.hostname)
            touched["all"].setdefault("", set()).add(w.hostname)
    if fitting < n:
        raise GangWaiting(_waiting(n, m, table.able, free))
    shrinking = all(h >= 0 for h in held.values())  # the ledger only takes slots (always, outside tests)
    for level in ("zone", "region"):
        options = []
        for name, group in table.groups[level].items():
            option = _best_in(table, level, name, group, n, m, res, free, touched[level].get(name), shrinking)
            if option is not None:
                options.append((option[0], name, option[1]))
        if options:
            _, name, chosen = min(options, key=lambda o: (o[0], o[1]))
            return _placement(chosen, f"placed on {n} worker{'s' if n > 1 else ''} in {level} {name}")
    chosen = _best_in(table, "all", "", table.able, n, m, res, free, touched["all"].get(""), shrinking)[1]
    regions = sorted({w.region or "no region" for w in chosen})
    return _placement(chosen, f"placed across regions {', '.join(regions)} (no single zone or region had "
                              f"{n} workers with {m} free slots)")


def _waiting(n: int, m: int, able: list[WorkerInfo], free) -> str:
    now = ", ".join(f"{w.id} {max(free(w), 0)}/{w.slots}" for w in able[:_MAX_LISTED])
    return f"waiting for {n} workers with {m} free slots each; free now: {now}"


def _best_in(table: GangTable, level: str, name: str, group: list[WorkerInfo], n: int, m: int, res: Resources,
             free, touched_hosts: set[str] | None, shrinking: bool):
    """The cost and the pick of ``n`` workers with ``m`` free slots in one group; None if too few.

    The same pick as ``_pick`` over the group's fitting workers, walked from the
    group's plan and stopped at the ``n``-th worker. The pick without the ledger
    is remembered; it stands while the ledger only takes slots (``shrinking``)
    on hosts the walk never reached, since those hosts can only fall further back.
    """
    plan = table.plans.get((level, name))
    if plan is None:
        plan = table.plans[(level, name)] = group_plan(group, m, res.gpus if res.cuda else 0)
    memo = (level, name, n)
    base = table.options.get(memo, _UNSEEN)
    if base is _UNSEEN:
        base = table.options[memo] = _walk(plan, n, m, lambda w: min(w.slots - w.busy, procs_capacity(w, res)), None)
    if not touched_hosts:
        return base
    if shrinking and (base is None or all(plan.pos.get(h, len(plan.hosts)) > base[2] for h in touched_hosts)):
        return base
    return _walk(plan, n, m, free, touched_hosts)


_UNSEEN = object()


def _walk(plan: GroupPlan, n: int, m: int, free, touched_hosts: set[str] | None):
    """Take ``n`` workers host by host, touched hosts re-read; ``(cost, chosen, last host index)`` or None."""
    count, again = plan.count, []
    for host in touched_hosts or ():
        ws = sorted((w for w in plan.members[host] if free(w) >= m), key=lambda w: (-w.free, w.id))
        count += len(ws) - plan.base.get(host, 0)
        if ws:
            again.append(((-len(ws), ws[0].id), host, ws))
    if count < n:
        return None
    again.sort(key=lambda e: e[0])
    rest = (e for e in plan.hosts if e[1] not in touched_hosts) if touched_hosts else iter(plan.hosts)
    out: list[WorkerInfo] = []
    last = -1
    for last, (_, _, ws) in enumerate(heapq.merge(rest, again, key=lambda e: e[0])):
        out.extend(ws[: n - len(out)])
        if len(out) == n:
            break
    chosen = sorted(out, key=lambda w: w.id)
    return _cost(chosen, free), chosen, last


def _pick(group: list[WorkerInfo], n: int) -> list[WorkerInfo]:
    """``n`` workers from ``group``: packed on as few hosts as possible, most free first, by id."""
    by_host: dict[str, list[WorkerInfo]] = {}
    for w in sorted(group, key=lambda w: (-w.free, w.id)):
        by_host.setdefault(w.hostname, []).append(w)
    hosts = sorted(by_host.values(), key=lambda ws: (-len(ws), ws[0].id))
    out: list[WorkerInfo] = []
    for ws in hosts:
        out.extend(ws[: n - len(out)])
        if len(out) == n:
            break
    return sorted(out, key=lambda w: w.id)


def _cost(chosen: list[WorkerInfo], free) -> tuple[int, int]:
    return len({w.hostname for w in chosen}), -sum(free(w) for w in chosen)


def _placement(chosen: list[WorkerInfo], reason: str) -> GangPlacement:
    return GangPlacement(workers=tuple(w.id for w in chosen), addresses=tuple(w.address for w in chosen),
                         hosts=tuple(w.hostname for w in chosen), reason=reason)
