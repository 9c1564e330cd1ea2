"""The placement implementation before the snapshot index (gpulayer 2026-11), kept verbatim as the
reference the indexed placement must agree with on every input (tests/test_placement.py).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from gpulayer import queues
from gpulayer.errors import JobRejected
from gpulayer.models import GangPlacement, GangSpec, Resources, WorkerInfo

_MAX_LISTED = 6


@dataclass(frozen=True)
class Route:
    """Where a job goes: the queue, and the live workers that read it."""

    queue: str
    eligible: tuple[str, ...]


def eligible_workers(res: Resources, workers: Sequence[WorkerInfo]) -> list[WorkerInfo]:
    """The live workers that satisfy every requirement of ``res``; raise why none does."""
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
                "start a worker on a GPU machine or drop cuda=True"
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


def route(res: Resources, workers: Sequence[WorkerInfo]) -> Route:
    """Name the queue for one job needing ``res``, or raise ``JobRejected`` with the reason.

    Pinned jobs go to a private queue (the least busy of the named workers);
    everything else to the shared capability queue that exactly the eligible
    workers read.
    """
    pool = eligible_workers(res, workers)
    if res.worker_ids:
        best = min(pool, key=lambda w: (-w.free, w.id))
        return Route(queues.private(best.id), (best.id,))
    return Route(queues.capability(res.gpus, zone=res.zone, region=res.region), tuple(w.id for w in pool))


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


def procs_capacity(w: WorkerInfo, res: Resources) -> int:
    """How many of a gang's processes ``w`` could ever hold (slots, and GPUs for CUDA gangs)."""
    return min(w.slots, w.gpus // res.gpus) if res.cuda else w.slots


def _gang_candidates(spec: GangSpec, workers: Sequence[WorkerInfo]) -> list[WorkerInfo]:
    """Workers that could ever hold one node of the gang; ``JobRejected`` if too few for all nodes."""
    res, n, m = spec.resources, spec.nodes, spec.procs_per_node
    if res.worker_ids and len(set(res.worker_ids)) < n:
        raise JobRejected(f"a gang of {n} nodes was pinned to only {len(set(res.worker_ids))} workers "
                          f"({', '.join(res.worker_ids)}); name at least {n} workers or lower nodes=")
    pool = eligible_workers(res, workers)
    able = [w for w in pool if procs_capacity(w, res) >= m]
    if len(able) < n:
        per = f"{m} slots" + (f" and {m * res.gpus} GPUs" if res.cuda else "")
        raise JobRejected(
            f"the gang needs {n} workers with {per} each, but only {len(able)} live worker(s) have that "
            f"(live: {', '.join(f'{w.id} {w.slots} slots' + (f' {w.gpus} GPUs' if w.gpus else '') for w in pool[:_MAX_LISTED])}); "
            f"lower nodes= or procs_per_node=, or start more workers")
    return able


def check_gang_fits_fleet(spec: GangSpec, workers: Sequence[WorkerInfo]) -> None:
    """Raise ``JobRejected`` now if the gang can never fit on the live fleet, even with every slot free."""
    _gang_candidates(spec, workers)


def place_gang(spec: GangSpec, workers: Sequence[WorkerInfo], held: dict[str, int]) -> GangPlacement:
    """Choose the gang's workers from a snapshot and the slot ledger (``held``: slots gangs hold per worker).

    All or nothing: either every node gets a worker with ``procs_per_node`` free
    slots, or ``GangWaiting`` says why not. Locality: one zone, else one region,
    else across regions; among equals, fewer hosts, then more free slots.
    """
    res, n, m = spec.resources, spec.nodes, spec.procs_per_node
    able = _gang_candidates(spec, workers)

    def free(w: WorkerInfo) -> int:
        return min(w.slots - w.busy - held.get(w.id, 0), procs_capacity(w, res) - held.get(w.id, 0))

    fits = [w for w in able if free(w) >= m]
    if len(fits) < n:
        now = ", ".join(f"{w.id} {max(free(w), 0)}/{w.slots}" for w in able[:_MAX_LISTED])
        raise GangWaiting(f"waiting for {n} workers with {m} free slots each; free now: {now}")
    if res.worker_ids:
        chosen = _pick(fits, n)
        return _placement(chosen, f"pinned to {', '.join(w.id for w in chosen)}")
    for level, key in (("zone", lambda w: w.zone), ("region", lambda w: w.region)):
        groups: dict[str, list[WorkerInfo]] = {}
        for w in fits:
            if key(w):
                groups.setdefault(key(w), []).append(w)
        options = [(_cost(_pick(g, n), free), name, _pick(g, n)) for name, g in groups.items() if len(g) >= n]
        if options:
            _, name, chosen = min(options, key=lambda o: (o[0], o[1]))
            return _placement(chosen, f"placed on {n} worker{'s' if n > 1 else ''} in {level} {name}")
    chosen = _pick(fits, n)
    regions = sorted({w.region or "no region" for w in chosen})
    return _placement(chosen, f"placed across regions {', '.join(regions)} (no single zone or region had "
                              f"{n} workers with {m} free slots)")


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
