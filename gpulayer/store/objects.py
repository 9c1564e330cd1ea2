"""The object store's records in Redis: which objects exist, who holds each, and the store's totals.

An object's bytes live in a store (``gpulayer/objects/backends.py``); its record here says how big it is, where
it lives and who holds it: a zset of holders, each with an expiry. The four scripts (``lua/obj_*.lua``) keep one
rule: an object is deleted only after a script saw it with no unexpired holder and marked it ``deleting``, and a
``deleting`` object can never be held again. So nothing held is ever deleted, whatever runs at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import redis

from . import keys
from .registry import load_script

LIVE, DELETING = "live", "deleting"
SCRIPT_BATCH = 500  # objects per script call: one call never holds Redis for long


class ObjectGone(LookupError):
    """An object asked to be held has no record, or is being deleted (``oid``)."""

    def __init__(self, oid: str):
        super().__init__(oid)
        self.oid = oid


class ObjectRecords:
    def __init__(self, client: redis.Redis):
        self.r = client
        self._create = load_script(client, "obj_create")
        self._hold = load_script(client, "obj_hold")
        self._release = load_script(client, "obj_release")
        self._forget = load_script(client, "obj_forget")
        self._fetched = load_script(client, "obj_fetched")

    def create(self, oid: str, size: int, store: str, created: float, holder: str, expiry: float) -> bool:
        """Record a new object held by ``holder`` until ``expiry``; False if ``oid`` has a record already."""
        return bool(self._create(keys=[keys.obj(oid), keys.obj_holders(oid), keys.OBJECTS, keys.OBJECTS_STATS],
                                 args=[oid, size, store, repr(created), holder, repr(float(expiry))]))

    def hold(self, holds: Iterable[tuple[str, str, float]]) -> None:
        """Add each (oid, holder, expiry), all or none (per ``SCRIPT_BATCH``); ``ObjectGone`` names one gone."""
        holds = list(holds)
        for start in range(0, len(holds), SCRIPT_BATCH):
            chunk = holds[start: start + SCRIPT_BATCH]
            ks, args = [], []
            for oid, holder, expiry in chunk:
                ks += [keys.obj(oid), keys.obj_holders(oid)]
                args += [oid, holder, repr(float(expiry))]
            refused = self._hold(keys=ks, args=args)
            if refused:
                raise ObjectGone(refused.decode() if isinstance(refused, bytes) else str(refused))

    def release(self, drops: Iterable[tuple[str, str]], now: float) -> list[tuple[str, str]]:
        """Drop each (oid, holder) (holder "": none, only prune expired ones); returns (oid, store) of the objects
        now left with no holder, marked deleting: the caller deletes their bytes, then calls ``forget``."""
        drops = list(drops)
        out: list[tuple[str, str]] = []
        for start in range(0, len(drops), SCRIPT_BATCH):
            ks, args = [], [repr(float(now))]
            for oid, holder in drops[start: start + SCRIPT_BATCH]:
                ks += [keys.obj(oid), keys.obj_holders(oid)]
                args += [oid, holder]
            flat = [x.decode() if isinstance(x, bytes) else x for x in self._release(keys=ks, args=args)]
            out += list(zip(flat[::2], flat[1::2]))
        return out

    def forget(self, oid: str) -> bool:
        """Drop the record of a deleting object whose bytes are gone."""
        return bool(self._forget(keys=[keys.obj(oid), keys.obj_holders(oid), keys.OBJECTS, keys.OBJECTS_STATS],
                                 args=[oid]))

    def fetched(self, oid: str) -> int | None:
        """One more host copied ``oid`` from a remote store; its count now (None: no record)."""
        return self._fetched(keys=[keys.obj(oid)])

    def record(self, oid: str) -> dict[str, str] | None:
        raw = self.r.hgetall(keys.obj(oid))
        return {k.decode(): v.decode() for k, v in raw.items()} if raw else None

    def holders(self, oid: str) -> dict[str, float]:
        return {k.decode(): float(v) for k, v in self.r.zrange(keys.obj_holders(oid), 0, -1, withscores=True)}

    def records(self, oids: list[str]) -> list[dict[str, str] | None]:
        """The records of ``oids`` (None for one without), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for oid in oids:
            pipe.hgetall(keys.obj(oid))
        return [{k.decode(): v.decode() for k, v in raw.items()} if raw else None for raw in pipe.execute()]

    def exists(self, oids: list[str]) -> list[bool]:
        pipe = self.r.pipeline(transaction=False)
        for oid in oids:
            pipe.exists(keys.obj(oid))
        return [bool(x) for x in pipe.execute()]

    def all_oids(self, batch: int = 1000) -> Iterator[list[str]]:
        """Every recorded oid, in batches (SSCAN: Redis is never held for long)."""
        cursor = 0
        while True:
            cursor, found = self.r.sscan(keys.OBJECTS, cursor, count=batch)
            if found:
                yield [x.decode() for x in found]
            if cursor == 0:
                return

    def drop_index(self, oids: list[str]) -> None:
        """Take oids whose record is gone out of the index (a record lost with a Redis that lost data)."""
        if oids:
            self.r.srem(keys.OBJECTS, *oids)

    def stats(self) -> tuple[int, int]:
        """(count, bytes) of the objects recorded."""
        raw = self.r.hmget(keys.OBJECTS_STATS, "count", "bytes")
        return int(raw[0] or 0), int(raw[1] or 0)

    def default_store(self, proposed: str) -> str:
        """The embedded cluster's store URL: ``proposed`` if no process of the cluster chose one before."""
        self.r.set(keys.OBJECTS_DEFAULT_STORE, proposed, nx=True)
        value = self.r.get(keys.OBJECTS_DEFAULT_STORE)
        return value.decode() if isinstance(value, bytes) else str(value)
