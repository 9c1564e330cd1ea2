"""An index over one snapshot of live workers, so placement costs what it decides.

Built once per snapshot object (one pass over the fleet) and cached: routing a
job becomes a dictionary lookup, and placing a gang looks only at the groups
(zones, regions) it could land in. The decisions themselves stay in
``placement.py``; this module only groups and remembers.

A snapshot is treated as frozen: the registry hands out tuples of frozen
``WorkerInfo``. A list is accepted too, and re-indexed when its length or its
first or last element changes, but a list edited in place in the middle is not
noticed; pass a new sequence instead.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .models import Resources, WorkerInfo

_CACHED_SNAPSHOTS = 8  # a router, a coordinator and a tool each hold one or two at a time

# (gpus needed, zone, region): what an unpinned request filters on (gpus 0 = CPU).
Key = tuple[int, str | None, str | None]


def request_key(res: Resources) -> Key:
    return (res.gpus if res.cuda else 0, res.zone, res.region)


def procs_capacity(w: WorkerInfo, res: Resources) -> int:
    """How many of a gang's processes ``w`` could ever hold (slots, and GPUs for CUDA gangs)."""
    return min(w.slots, w.gpus // res.gpus) if res.cuda else w.slots


@dataclass
class GangTable:
    """The workers able to hold one node of a gang needing ``m`` processes of one request.

    ``base_fits`` counts the able workers with room for a node before the slot
    ledger; ``groups`` holds the able workers per zone and
    per region, in snapshot order; ``options`` remembers each group's best pick
    for ``n`` nodes while the ledger does not touch the group.
    """

    able: list[WorkerInfo]
    able_by_id: dict[str, list[WorkerInfo]]
    base_fits: int
    groups: dict[str, dict[str, list[WorkerInfo]]]
    options: dict[tuple[str, str, int], tuple | None] = field(default_factory=dict)
    plans: dict[tuple[str, str], GroupPlan] = field(default_factory=dict)


@dataclass
class GroupPlan:
    """One zone's or region's able workers, grouped by host the way a gang pick walks them.

    ``hosts``: the hosts with room for a node before the slot ledger, each as
    ``(sort key, hostname, workers)`` with workers most free first, sorted by
    more fitting workers first, then by the id of the host's first worker;
    ``count``: how many workers those hosts hold; ``members``: every able
    worker of the group per host, to look at a host again when the ledger
    holds slots on it.
    """

    hosts: list[tuple[tuple[int, str], str, list[WorkerInfo]]]
    base: dict[str, int]
    count: int
    members: dict[str, list[WorkerInfo]]
    pos: dict[str, int]  # hostname -> index in hosts


def group_plan(group: list[WorkerInfo], base_fit) -> GroupPlan:
    members: dict[str, list[WorkerInfo]] = {}
    by_host: dict[str, list[WorkerInfo]] = {}
    for w in group:
        members.setdefault(w.hostname, []).append(w)
    for w in sorted((w for w in group if base_fit(w)), key=lambda w: (-w.free, w.id)):
        by_host.setdefault(w.hostname, []).append(w)
    hosts = sorted((((-len(ws), ws[0].id), h, ws) for h, ws in by_host.items()), key=lambda e: e[0])
    return GroupPlan(hosts, {h: len(ws) for h, ws in by_host.items()}, sum(len(ws) for ws in by_host.values()),
                     members, {e[1]: i for i, e in enumerate(hosts)})


class SnapshotIndex:
    """Live workers grouped by id, zone, region and GPU count, built in one pass."""

    def __init__(self, workers: Sequence[WorkerInfo]):
        self.workers: tuple[WorkerInfo, ...] = tuple(workers)
        self.by_id: dict[str, WorkerInfo] = {}
        self.by_zone: dict[str, list[WorkerInfo]] = {}
        self.by_region: dict[str, list[WorkerInfo]] = {}
        gpu_counts: set[int] = set()
        for w in self.workers:
            self.by_id[w.id] = w
            if w.zone is not None:
                self.by_zone.setdefault(w.zone, []).append(w)
            if w.region is not None:
                self.by_region.setdefault(w.region, []).append(w)
            if w.gpus > 0:
                gpu_counts.add(w.gpus)
        # _levels[i]: every worker with at least _gpu_levels[i] GPUs, in snapshot order.
        self._gpu_levels = sorted(gpu_counts)
        self._levels = [[w for w in self.workers if w.gpus >= g] for g in self._gpu_levels]
        self.routes: dict[Key, object] = {}  # placement.Route, or the refusal's message, per request key
        self.refusals: dict[tuple, str] = {}  # why a gang can never fit, per (request key, nodes, procs)
        self._eligible: dict[Key, tuple[WorkerInfo, ...]] = {}
        self._gangs: dict[tuple[Key, int], GangTable] = {}
        # The memo dicts are filled without a lock: two threads may compute one entry twice, never wrongly.

    def with_gpus(self, gpus: int) -> list[WorkerInfo]:
        """Every worker with at least ``gpus`` GPUs, in snapshot order."""
        i = bisect.bisect_left(self._gpu_levels, gpus)
        return self._levels[i] if i < len(self._levels) else []

    def eligible(self, key: Key) -> tuple[WorkerInfo, ...]:
        """The workers meeting an unpinned request, in snapshot order (empty when none does)."""
        got = self._eligible.get(key)
        if got is None:
            gpus, zone, region = key
            bases = [self.workers]
            if gpus:
                bases.append(self.with_gpus(gpus))
            if zone is not None:
                bases.append(self.by_zone.get(zone, ()))
            if region is not None:
                bases.append(self.by_region.get(region, ()))
            base = min(bases, key=len)  # filter the smallest group by the rest; order stays the snapshot's
            got = tuple(w for w in base if (not gpus or w.gpus >= gpus) and (zone is None or w.zone == zone)
                        and (region is None or w.region == region))
            self._eligible[key] = got
        return got

    def gang_table(self, res: Resources, m: int) -> GangTable:
        """The able workers for nodes of ``m`` processes of an unpinned request ``res``."""
        k = (request_key(res), m)
        table = self._gangs.get(k)
        if table is None:
            able, by_id, fits = [], {}, 0
            zones: dict[str, list[WorkerInfo]] = {}
            regions: dict[str, list[WorkerInfo]] = {}
            for w in self.eligible(k[0]):
                cap = procs_capacity(w, res)
                if cap < m:
                    continue
                able.append(w)
                by_id.setdefault(w.id, []).append(w)
                fits += min(w.slots - w.busy, cap) >= m
                if w.zone:
                    zones.setdefault(w.zone, []).append(w)
                if w.region:
                    regions.setdefault(w.region, []).append(w)
            table = self._gangs[k] = GangTable(able, by_id, fits, {"zone": zones, "region": regions})
        return table


_cache: OrderedDict[int, tuple[Sequence[WorkerInfo], SnapshotIndex]] = OrderedDict()
_cache_lock = threading.Lock()


def index_for(workers: Sequence[WorkerInfo]) -> SnapshotIndex:
    """The index of this snapshot object, built on first use and cached with the last few.

    The cache keeps a reference to each snapshot it indexes, so an id is never
    reused while its entry lives.
    """
    key = id(workers)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is workers and _unchanged(workers, hit[1]):
            _cache.move_to_end(key)
            return hit[1]
    index = SnapshotIndex(workers)
    with _cache_lock:
        _cache[key] = (workers, index)
        _cache.move_to_end(key)
        while len(_cache) > _CACHED_SNAPSHOTS:
            _cache.popitem(last=False)
    return index


def _unchanged(workers: Sequence[WorkerInfo], index: SnapshotIndex) -> bool:
    if isinstance(workers, tuple):
        return True
    n = len(index.workers)
    return len(workers) == n and (n == 0 or (workers[0] is index.workers[0] and workers[-1] is index.workers[-1]))


def clear_cache() -> None:
    """Forget every cached index (tests, and tools that want the memory back)."""
    with _cache_lock:
        _cache.clear()
