"""Routing and placement: pure functions over a snapshot of live workers.

A frozen snapshot in, a decision or a reason out. No Redis, no Celery, no
clock: tested in microseconds, fast enough for thousands of workers.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from . import queues
from .errors import JobRejected
from .models import Resources, WorkerInfo

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
