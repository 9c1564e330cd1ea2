"""The worker registry: heartbeats in, snapshots of live workers out.

The registry keeps a version (``keys.WORKERS_VERSION``). A heartbeat bumps it
only for what a reader must see again: a new or changed worker record, a
worker back from the dead, or new busy/held counts, each tracked apart
(``keys.WORKERS_CHANGED``, ``keys.WORKERS_LOAD_CHANGED``). So a reader pays
the full read once (``Registry.snapshot``) and then refreshes with what changed
since its version (``FleetView``, behind ``CachedSnapshot``): a changed busy
count costs three short strings, not a worker's whole record. Who is alive is
judged by Redis's clock in both.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from importlib import resources as _res

import redis
from pydantic import TypeAdapter

from ..models import WorkerInfo
from . import keys
from .packed import collector_paused, pack, pack_static_json, trusted, unpack, unpack_live

log = logging.getLogger(__name__)

_RECORDS = TypeAdapter(list[WorkerInfo])
_DYNAMIC = {"busy", "held", "heartbeat_age"}  # what a worker's static record leaves out
BEAT_CHUNK = 500  # workers per heartbeat script call for a caller that beats thousands at once (a benchmark)
_BEAT_KEYS = [keys.WORKERS, keys.WORKERS_INFO, keys.WORKERS_STATIC, keys.WORKERS_LOAD, keys.WORKERS_VERSION,
              keys.WORKERS_CHANGED, keys.WORKERS_LOAD_CHANGED, keys.WORKERS_PACKED, keys.WORKERS_PACKED_SYNCED]
_SNAP_KEYS = [keys.WORKERS, keys.WORKERS_INFO, keys.WORKERS_STATIC, keys.WORKERS_LOAD, keys.WORKERS_VERSION,
              keys.WORKERS_PACKED, keys.WORKERS_PACKED_SYNCED]


class Script(redis.commands.core.Script):
    """redis-py's registered script, loaded again each time a server lacks it, not once.

    After a failover a call can meet two servers without it: the old primary, back as a replica, answers
    ``NOSCRIPT``; once loaded there, it refuses the script's writes with ``READONLY``, and the command goes again
    to the new primary (``store/sentinel.py``), whose script cache is empty too (caches are not replicated)."""

    TRIES = 3

    def __call__(self, keys=None, args=None, client=None):
        client = self.registered_client if client is None else client
        if isinstance(client, redis.client.Pipeline):  # a pipeline loads its scripts before it runs
            return super().__call__(keys, args, client)
        for attempt in range(1, self.TRIES + 1):
            try:
                return client.evalsha(self.sha, len(keys or ()), *(keys or ()), *(args or ()))
            except redis.exceptions.NoScriptError:
                if attempt == self.TRIES:
                    raise
                self.sha = client.script_load(self.script)


def load_script(client: redis.Redis, name: str) -> Script:
    """A registered Lua script from ``store/lua/<name>.lua`` (its file read once per process: a job that
    carries object refs builds its records' scripts per hold and release)."""
    return Script(client, _script_text(name))


@functools.lru_cache(maxsize=None)
def _script_text(name: str) -> str:
    return _res.files(__package__).joinpath("lua", f"{name}.lua").read_text()


def static_record(info: WorkerInfo) -> str:
    """What a worker advertises that rarely changes: its record without busy, held and heartbeat age."""
    return info.model_dump_json(exclude=_DYNAMIC)


class Registry:
    """Who is alive, judged by Redis's clock."""

    def __init__(self, client: redis.Redis, dead_after: float = 5.0):
        self.client = client
        self.dead_after = dead_after
        self._beat = load_script(client, "heartbeat")
        self._snap = load_script(client, "snapshot")
        self._changes = load_script(client, "snapshot_changes")
        self._pack_all = load_script(client, "pack_all")
        self._current: FleetView | None = None
        self._current_lock = threading.Lock()

    def heartbeat(self, info: WorkerInfo) -> None:
        self.heartbeat_many([info])

    def heartbeat_many(self, infos: Iterable[WorkerInfo], static: dict[str, str] | None = None) -> None:
        """Heartbeat many workers in a few script calls (one per 500), pipelined.

        ``static`` maps worker ids to their ``static_record`` when the caller keeps
        them (an emulator beating 10,000 workers need not re-serialise each one).
        """
        self.beat([(w.id, (static or {}).get(w.id) or static_record(w), w.busy, w.held) for w in infos])

    def beat(self, rows: list[tuple[str, str, int, int]]) -> None:
        """Heartbeat ``(worker id, static record, busy, held)`` rows, 500 per script call, one pipeline."""
        calls = []
        for i in range(0, len(rows), BEAT_CHUNK):
            args: list = [self.dead_after]
            for wid, static, busy, held in rows[i:i + BEAT_CHUNK]:
                args += (wid, static, pack_static_json(static), busy, held)
            calls.append(args)
        if len(calls) == 1:
            self._beat(keys=_BEAT_KEYS, args=calls[0])
            return
        pipe = self.client.pipeline(transaction=False)
        for a in calls:
            self._beat(keys=_BEAT_KEYS, args=a, client=pipe)
        pipe.execute()

    def remove(self, worker_id: str) -> None:
        self.remove_many([worker_id])

    def remove_many(self, worker_ids: Iterable[str]) -> None:
        """Take workers out of the registry, every record of theirs."""
        pipe = self.client.pipeline()
        for wid in worker_ids:
            for key in (keys.WORKERS, keys.WORKERS_CHANGED, keys.WORKERS_LOAD_CHANGED):
                pipe.zrem(key, wid)
            for key in (keys.WORKERS_INFO, keys.WORKERS_STATIC, keys.WORKERS_LOAD, keys.WORKERS_PACKED,
                        keys.WORKERS_STARTING):
                pipe.hdel(key, wid)
        pipe.execute()

    def mark_starting(self, worker_id: str, pid: int) -> None:
        """``worker_id`` is about to register and will not answer a control broadcast for a while
        (``worker/starting.py``); set before its first heartbeat, so no broadcast finds it live and unmarked."""
        self.client.hset(keys.WORKERS_STARTING, worker_id, pid)

    def mark_answering(self, worker_id: str) -> None:
        """``worker_id`` answers control broadcasts now."""
        self.client.hdel(keys.WORKERS_STARTING, worker_id)

    def starting(self) -> set[str]:
        """The live workers (by Redis's clock) that do not answer control broadcasts yet: one ``HKEYS`` while
        there are none, what a broadcast costs on a fleet that runs."""
        ids = [w.decode() for w in self.client.hkeys(keys.WORKERS_STARTING)]
        if not ids:
            return set()
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.zmscore(keys.WORKERS, ids)
        (secs, micros), beats = pipe.execute()
        cutoff = secs + micros / 1e6 - self.dead_after
        return {wid for wid, beat in zip(ids, beats) if beat is not None and beat >= cutoff}

    def snapshot(self) -> tuple[WorkerInfo, ...]:
        """Every live worker, sorted by id, each with its heartbeat age (the full read)."""
        return self.read()[1]

    def current(self) -> tuple[WorkerInfo, ...]:
        """Every live worker now, as ``snapshot()``, read incrementally after the first call.

        Membership and busy/held counts are exact as of the call; heartbeat ages are
        those of each record's last read. What a coordinator or a liveness check
        wants at 10,000 workers: it costs what changed, not the fleet.
        """
        with self._current_lock:
            if self._current is None:
                self._current = FleetView(self)
            return self._current.refresh()

    def read(self) -> tuple[int, tuple[WorkerInfo, ...]]:
        """The full read: the registry's version and every live worker, sorted by id.

        Packed records (``store/packed.py``) where the registry has them in sync, JSON for the
        rest; a read that found them out of sync (a writer of an older gpulayer changed something)
        writes them all back, so the next read is packed again.
        """
        direct = self._read_packed()
        if direct is not None:
            return direct
        now, version, synced, packed, blob = self._snap(keys=_SNAP_KEYS, args=[self.dead_after])
        workers = unpack(packed.decode(), float(now))
        if len(blob) > 2:
            workers += _RECORDS.validate_json(blob)
        workers.sort(key=_by_id)
        if not synced and workers:
            self._pack_all(keys=[keys.WORKERS_VERSION, keys.WORKERS_PACKED, keys.WORKERS_PACKED_SYNCED, keys.WORKERS_STATIC],
                           args=[version, *itertools.chain.from_iterable((w.id, pack(w)) for w in workers)])
        return int(version), tuple(workers)

    def _read_packed(self) -> tuple[int, tuple[WorkerInfo, ...]] | None:
        """The full read while every live worker's packed record is in sync: five plain commands in one
        transaction, joined here; ``None`` sends the read to ``snapshot.lua`` (JSON records, re-packing).

        Redis sends the heartbeat times and the packed records (``HVALS``: each record begins with its
        worker's id) as they are stored; the script that joined them cost Redis 45 ms of its one core per
        read at 10,000 workers (Lua's strings and ``table.concat``), this costs it a fraction
        (``benchmarks/placement_scale.py``). The heartbeat times include the dead's: liveness is judged
        here against Redis's ``TIME`` from the same transaction.
        """
        with collector_paused():
            return self._join_packed()

    def _join_packed(self) -> tuple[int, tuple[WorkerInfo, ...]] | None:
        """``_read_packed``'s work; the reply's objects are gone before the collector runs again."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.execute_command("TIME")
            pipe.get(keys.WORKERS_VERSION)
            pipe.get(keys.WORKERS_PACKED_SYNCED)
            pipe.execute_command("ZRANGEBYSCORE", keys.WORKERS, "-inf", "+inf", "WITHSCORES")
            pipe.hvals(keys.WORKERS_PACKED)
            (sec, usec), version, synced, beats, records = pipe.execute()
        if synced != version or version is None:
            return None
        now = int(sec) + int(usec) / 1e6
        cutoff = now - self.dead_after
        # RESP3 sends (id, score) pairs with the score a double; RESP2 a flat list of strings. By score:
        # the dead (older than the cutoff) come first.
        if beats and isinstance(beats[0], list):
            ids, times = zip(*beats)
        else:
            ids, times = beats[::2], list(map(float, beats[1::2]))
        first_live = bisect.bisect_left(times, cutoff)
        ids = ids[first_live:]
        live = dict(zip(map(bytes.decode, ids) if ids and isinstance(ids[0], bytes) else ids, times[first_live:]))
        workers = unpack_live(records, live, now)
        if workers is None:  # a live worker without a packed record: its JSON one is read by the script
            return None
        return int(version), tuple(workers)

    def changes(self, since: int) -> Changes:
        """What changed after version ``since`` (see ``snapshot_changes.lua``)."""
        _, version, blob, loads, dead, live = self._changes(
            keys=[keys.WORKERS, keys.WORKERS_STATIC, keys.WORKERS_LOAD, keys.WORKERS_VERSION,
                  keys.WORKERS_CHANGED, keys.WORKERS_LOAD_CHANGED], args=[self.dead_after, since])
        records = _RECORDS.validate_json(blob) if len(blob) > 2 else []
        load = {}
        for row in loads.decode().split("\n") if loads else ():
            wid, busy, held = row.rsplit(" ", 2)  # ids may hold spaces; the counts never do
            load[wid] = (int(busy), int(held))
        return Changes(int(version), records, load, {d.decode() for d in dead}, int(live))

    def ages(self, ids: Iterable[str] | None = None) -> dict[str, float]:
        """Seconds since each worker's last heartbeat, by Redis's clock, dead ones included.

        Every worker in the registry (one ``ZRANGE``), or only ``ids`` (one ``ZSCORE``
        each, pipelined: what a check of a few peers costs); a worker the registry
        does not hold (never seen, or buried) is absent.
        """
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        if ids is None:
            pipe.zrange(keys.WORKERS, 0, -1, withscores=True)
            (secs, micros), rows = pipe.execute()
            beats = {w.decode(): score for w, score in rows}
        else:
            ids = list(ids)
            for wid in ids:
                pipe.zscore(keys.WORKERS, wid)
            (secs, micros), *scores = pipe.execute()
            beats = {wid: score for wid, score in zip(ids, scores) if score is not None}
        now = secs + micros / 1e6
        return {wid: max(0.0, now - score) for wid, score in beats.items()}

    def using(self, client: redis.Redis) -> "Registry":
        """This registry (its death line) read over another client: a gang node's own connection."""
        return Registry(client, self.dead_after)

    def life(self, worker_id: str) -> str | None:
        """The life (``keys.life``) the registry last heard from as ``worker_id``; ``None`` if it holds none."""
        raw = self.client.hget(keys.WORKERS_INFO, worker_id)
        try:
            return keys.life(worker_id, int(json.loads(raw)["pid"])) if raw else None
        except (ValueError, KeyError, TypeError):
            return None

    def dead(self) -> dict[str, float]:
        """Workers still in the registry but silent past ``dead_after`` (not yet buried), with their ages."""
        secs, micros = self.client.time()
        now = secs + micros / 1e6
        rows = self.client.zrangebyscore(keys.WORKERS, "-inf", f"({now - self.dead_after}", withscores=True)
        return {w.decode(): now - score for w, score in rows}

    def live_ids(self) -> set[str]:
        """The ids of every live worker (by Redis's clock), nothing else."""
        now = self.client.time()
        cutoff = now[0] + now[1] / 1e6 - self.dead_after
        return {w.decode() for w in self.client.zrangebyscore(keys.WORKERS, cutoff, "+inf")}


def _by_id(w: WorkerInfo) -> str:
    return w.id


class Changes:
    """One incremental read: new version, changed records, changed (busy, held), dead ids, live count."""

    __slots__ = ("version", "records", "load", "dead", "live")

    def __init__(self, version: int, records: list[WorkerInfo], load: dict[str, tuple[int, int]],
                 dead: set[str], live: int):
        self.version, self.records, self.load, self.dead, self.live = version, records, load, dead, live


class Snapshot(tuple):
    """A tuple of live ``WorkerInfo``, sorted by id, that also carries its ``layout``.

    Two snapshots with the same layout hold the same workers with the same records;
    only busy/held counts may differ (what placement may carry over between them).
    """

    layout: int


_layout_ids = itertools.count(1)


def _snapshot(workers, layout: int) -> Snapshot:
    out = Snapshot(workers)
    out.layout = layout
    return out


def _with_load(w: WorkerInfo, busy: int, held: int) -> WorkerInfo:
    """``w`` with new busy/held counts: ``model_copy(update=...)`` without its per-call overhead.

    A refresh may carry thousands of these; the values are ints from our own Lua script.
    """
    fields = dict(w.__dict__)
    fields["busy"], fields["held"] = busy, held
    return trusted(fields, w.model_fields_set | {"busy", "held"})


class FleetView:
    """A client's copy of the live fleet, kept current by incremental reads.

    ``refresh()`` pays the full read once, then reads only what changed after
    the version it holds. It returns the same tuple object while nothing
    changed, so the placement index built for it is reused. Heartbeat ages are
    those of each record's last read (``Registry.snapshot()`` has exact ones).
    """

    def __init__(self, registry: Registry):
        self.registry = registry
        self.version: int | None = None
        self.full_reads = 0
        self._known: dict[str, WorkerInfo] = {}
        self._order: list[str] = []  # sorted ids of _known
        self._dead: set[str] = set()
        self._value: tuple[WorkerInfo, ...] = ()
        self._pos: dict[str, int] = {}  # worker id -> index in _value
        self._layout = 0

    def refresh(self) -> tuple[WorkerInfo, ...]:
        if self.version is None:
            return self._full()
        ch = self.registry.changes(self.version)
        joined = False
        for w in ch.records:
            joined = joined or w.id not in self._known
            self._known[w.id] = w
        if joined:
            self._order = sorted(self._known)
        loaded = []
        for wid, (busy, held) in ch.load.items():
            w = self._known.get(wid)
            if w is not None and (w.busy, w.held) != (busy, held):
                self._known[wid] = _with_load(w, busy, held)
                loaded.append(wid)
        moved = joined or ch.dead != self._dead  # workers came, went or died: lay the snapshot out anew
        self._dead, self.version = ch.dead, ch.version
        if moved:
            self._lay_out()
        elif ch.records or loaded:  # same workers in the same places: patch the changed ones into a copy
            value = list(self._value)
            for wid in itertools.chain((w.id for w in ch.records), loaded):
                i = self._pos.get(wid)
                if i is not None:
                    value[i] = self._known[wid]
            if ch.records:  # new records: placement must not carry anything over
                self._layout = next(_layout_ids)
            self._value = _snapshot(value, self._layout)
        if len(self._value) != ch.live:
            self._resync()
        return self._value

    def _lay_out(self) -> None:
        """A new snapshot of the known live workers, in id order, with a new layout."""
        self._layout = next(_layout_ids)
        self._value = _snapshot((self._known[i] for i in self._order if i not in self._dead), self._layout)
        self._pos = {w.id: i for i, w in enumerate(self._value)}

    def _full(self) -> tuple[WorkerInfo, ...]:
        self.version, workers = self.registry.read()
        self.full_reads += 1
        self._known = {w.id: w for w in workers}
        self._order = [w.id for w in workers]
        self._dead = set()
        self._lay_out()
        return self._value

    def _resync(self) -> None:
        """Workers left without a version bump (buried by the janitor): drop them, or read everything."""
        live = self.registry.live_ids()
        if not live <= self._known.keys():
            self._full()
            return
        for wid in [w for w in self._known if w not in live]:
            del self._known[wid]
        self._order = sorted(self._known)
        self._lay_out()


class CachedSnapshot:
    """A registry snapshot reused for ``ttl`` seconds (the router's view of the fleet).

    Each refresh after the first reads only what changed (``FleetView``). A caller
    past half the ttl gets the current snapshot at once while a thread fetches the
    next, so a client that submits steadily never waits for a refresh; a snapshot
    older than the ttl, or one ``invalidate()`` dropped, is refreshed before
    ``get`` returns.
    """

    def __init__(self, registry: Registry, ttl: float = 1.0):
        self.registry = registry
        self.ttl = ttl
        self._reset_state()

    def _reset_state(self) -> None:
        self._pid = os.getpid()
        self._at = float("-inf")
        self._view = FleetView(self.registry)
        self._lock = threading.Lock()  # guards _at and _refreshing
        self._refresh_lock = threading.Lock()  # one refresh of the view at a time
        self._refreshing = False
        self._forced = True

    def get(self) -> tuple[WorkerInfo, ...]:
        if self._pid != os.getpid():  # forked: locks and connections belong to the parent
            self._reset_state()
        with self._lock:
            age = time.monotonic() - self._at
            if age <= self.ttl and not self._forced:
                if age > self.ttl / 2 and not self._refreshing:  # an active caller never waits for a refresh
                    self._refreshing = True
                    threading.Thread(target=self._refresh_behind, name="gpulayer-registry-refresh", daemon=True).start()
                return self._view._value
        self._refresh()  # older than the ttl (an idle caller), or invalidated: never route on that
        return self._view._value

    def _refresh(self) -> None:
        with self._refresh_lock:
            self._view.refresh()
        with self._lock:
            self._at, self._forced = time.monotonic(), False

    def _refresh_behind(self) -> None:
        try:
            self._refresh()
        except Exception as err:  # Redis away: keep the last view; a get past the ttl tries (and raises) itself
            log.warning("gpulayer: background registry refresh failed (%s)", err)
        finally:
            with self._lock:
                self._refreshing = False

    def invalidate(self) -> None:
        """Refresh (incrementally) before the next ``get`` returns."""
        with self._lock:
            self._at = float("-inf")
            self._forced = True

    def reset(self) -> None:
        """Forget everything: the next ``get`` pays a full read."""
        with self._lock:
            self._at = float("-inf")
            self._forced = True
            self._view = FleetView(self.registry)
