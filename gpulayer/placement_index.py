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
from collections import OrderedDict, defaultdict
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
    ledger; ``groups`` holds the able workers per zone and per region, in
    snapshot order; ``options`` remembers each group's best pick for ``n`` nodes
    without the ledger, ``plans`` each group's hosts in pick order.
    """

    able: list[WorkerInfo]
    base_fits: int
    groups: dict[str, dict[str, list[WorkerInfo]]]
    options: dict[tuple[str, str, int], tuple | None] = field(default_factory=dict)
    plans: dict[tuple[str, str], GroupPlan] = field(default_factory=dict)
    _by_id: dict[str, list[WorkerInfo]] | None = None

    @property
    def able_by_id(self) -> dict[str, list[WorkerInfo]]:
        """The able workers by id (built when a ledger first names one)."""
        if self._by_id is None:
            by_id = defaultdict(list)
            for w in self.able:
                by_id[w.id].append(w)
            self._by_id = dict(by_id)
        return self._by_id


@dataclass
class GroupPlan:
    """One zone's or region's able workers, grouped by host the way a gang pick walks them.

    ``hosts``: the hosts with room for a node before the slot ledger, each as
    ``(sort key, hostname, workers)`` with workers most free first, sorted by
    more fitting workers first, then by the id of the host's first worker;
    ``count``: how many workers those hosts hold; ``members``: every able
    worker of the group per host (built when the ledger first touches the
    group), to look at a host again when the ledger holds slots on it.
    """

    group: list[WorkerInfo]
    hosts: list[tuple[tuple[int, str], str, list[WorkerInfo]]]
    base: dict[str, int]
    count: int
    pos: dict[str, int]  # hostname -> index in hosts
    _members: dict[str, list[WorkerInfo]] | None = None

    @property
    def members(self) -> dict[str, list[WorkerInfo]]:
        if self._members is None:
            members = defaultdict(list)
            for w in self.group:
                members[w.hostname].append(w)
            self._members = dict(members)
        return self._members


def _most_free_first(w: WorkerInfo) -> tuple[int, str]:
    return -w.free, w.id


def _id(w: WorkerInfo) -> str:
    return w.id


def group_plan(group: list[WorkerInfo], m: int, gpus: int) -> GroupPlan:
    """The plan of ``group`` for nodes of ``m`` processes needing ``gpus`` GPUs each (0: CPU)."""
    fitting = [w for w in group if min(w.slots - w.busy, min(w.slots, w.gpus // gpus) if gpus else w.slots) >= m]
    if len({w.hostname for w in fitting}) == len(fitting):
        # One fitting worker per host (the usual fleet): hosts sort by (-1, id), i.e. by worker id.
        hosts = [((-1, w.id), w.hostname, [w]) for w in sorted(fitting, key=_id)]
        base = {w.hostname: 1 for w in fitting}
    else:
        by_host = defaultdict(list)
        for w in sorted(fitting, key=_most_free_first):
            by_host[w.hostname].append(w)
        hosts = sorted((((-len(ws), ws[0].id), h, ws) for h, ws in by_host.items()), key=lambda e: e[0])
        base = {h: len(ws) for h, ws in by_host.items()}
    return GroupPlan(group, hosts, base, len(fitting), {e[1]: i for i, e in enumerate(hosts)})


class SnapshotIndex:
    """Live workers grouped by id, zone, region and GPU count, built in one pass when first needed.

    ``inherit``: the index of an earlier snapshot with the same ``layout`` (same
    workers, same records; only busy/held counts moved). Its routes and refusals
    depend on nothing else, so they carry over and a route stays a lookup across
    the client's once-a-second refreshes.
    """

    def __init__(self, workers: Sequence[WorkerInfo], inherit: SnapshotIndex | None = None):
        self.workers: tuple[WorkerInfo, ...] = tuple(workers)
        self._built = False
        # placement.Route, or the refusal's message, per request key; why a gang can never fit, per
        # (request key, nodes, procs). The memo dicts are filled without a lock: two threads may
        # compute one entry twice, never wrongly.
        self.routes: dict[Key, object] = dict(inherit.routes) if inherit else {}
        self.refusals: dict[tuple, str] = dict(inherit.refusals) if inherit else {}
        self._eligible: dict[Key, tuple[WorkerInfo, ...]] = {}
        self._gangs: dict[tuple[Key, int], GangTable] = {}

    def _build(self) -> None:
        self._by_id = {w.id: w for w in self.workers}
        by_zone, by_region = defaultdict(list), defaultdict(list)
        for w in self.workers:
            by_zone[w.zone].append(w)
            by_region[w.region].append(w)
        by_zone.pop(None, None)
        by_region.pop(None, None)
        self._by_zone: dict[str, list[WorkerInfo]] = dict(by_zone)
        self._by_region: dict[str, list[WorkerInfo]] = dict(by_region)
        # _levels[i]: every worker with at least _gpu_levels[i] GPUs, in snapshot order.
        self._gpu_levels = sorted({w.gpus for w in self.workers if w.gpus > 0})
        self._levels = [[w for w in self.workers if w.gpus >= g] for g in self._gpu_levels]
        self._built = True

    @property
    def by_id(self) -> dict[str, WorkerInfo]:
        if not self._built:
            self._build()
        return self._by_id

    @property
    def by_zone(self) -> dict[str, list[WorkerInfo]]:
        if not self._built:
            self._build()
        return self._by_zone

    @property
    def by_region(self) -> dict[str, list[WorkerInfo]]:
        if not self._built:
            self._build()
        return self._by_region

    def with_gpus(self, gpus: int) -> list[WorkerInfo]:
        """Every worker with at least ``gpus`` GPUs, in snapshot order."""
        if not self._built:
            self._build()
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
            g = res.gpus if res.cuda else 0
            able, fits = [], 0
            zones, regions = defaultdict(list), defaultdict(list)
            for w in self.eligible(k[0]):
                cap = min(w.slots, w.gpus // g) if g else w.slots  # procs_capacity, inlined: 10,000 calls
                if cap < m:
                    continue
                able.append(w)
                fits += min(w.slots - w.busy, cap) >= m
                zones[w.zone].append(w)
                regions[w.region].append(w)
            for groups in (zones, regions):  # groups are named: workers without a zone or region join none
                groups.pop(None, None)
                groups.pop("", None)
            table = self._gangs[k] = GangTable(able, fits, {"zone": dict(zones), "region": dict(regions)})
        return table


_cache: OrderedDict[int, tuple[Sequence[WorkerInfo], SnapshotIndex]] = OrderedDict()
_layouts: dict[object, SnapshotIndex] = {}  # the latest index per snapshot layout
_cache_lock = threading.Lock()


def index_for(workers: Sequence[WorkerInfo]) -> SnapshotIndex:
    """The index of this snapshot object, built on first use and cached with the last few.

    The cache keeps a reference to each snapshot it indexes, so an id is never
    reused while its entry lives.
    """
    key = id(workers)
    layout = getattr(workers, "layout", None)  # registry.Snapshot: same layout, same workers and records
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is workers and _unchanged(workers, hit[1]):
            _cache.move_to_end(key)
            return hit[1]
        inherit = _layouts.get(layout) if layout is not None else None
    index = SnapshotIndex(workers, inherit)
    with _cache_lock:
        _cache[key] = (workers, index)
        _cache.move_to_end(key)
        while len(_cache) > _CACHED_SNAPSHOTS:
            _cache.popitem(last=False)
        if layout is not None:
            _layouts[layout] = index
            while len(_layouts) > _CACHED_SNAPSHOTS:
                _layouts.pop(next(iter(_layouts)))
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
        _layouts.clear()
