"""How long an object lives: as long as something holds it, and not a moment longer than its last holder.

Holders, each with an expiry (``store/objects.py`` keeps them in Redis):

- ``put:<process token>``: the process that called ``gpulayer.put``; dropped by ``gpulayer.free(ref)`` or when
  its ref is garbage-collected (``api.py``), expiring after ``result_expires``;
- ``arg:<job id>``: a job that takes the object as an argument, added before its message is sent, dropped when
  the job reaches its final state;
- ``res:<job id>``: a stored result that holds the object, expiring with the result, dropped by ``h.forget()``.

Whoever drops the last holder deletes the bytes; ``sweep`` catches the rest (holders that expired, deleters that
died, files no record names). Nothing held is ever deleted: see ``store/objects.py``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import ObjectMissing
from ..store.objects import DELETING, ObjectGone, ObjectRecords
from .backends import backend_for, normal_url
from .ref import ObjectRef

PUT, ARG, RES = "put:", "arg:", "res:"
ORPHAN_AGE = 3600.0  # a file this old with no record is a writer's that died before recording it
STALE_DELETING = 300.0  # a record marked deleting this long ago: its deleter died; a sweep finishes the job
ORPHANS_EVERY = 600.0  # a process lists a store's files for orphans at most this often (a sweep runs every 30 s)
_orphans_swept: dict[str, float] = {}  # store URL -> when this process last listed it (monotonic)

_token: str | None = None


def process_token() -> str:
    """This process's own name among holders (new in a forked child: it holds nothing of its parent's)."""
    global _token
    if _token is None:
        _token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return _token


def _forget_token() -> None:
    global _token
    _token = None


os.register_at_fork(after_in_child=_forget_token)


def put_holder() -> str:
    return PUT + process_token()


def arg_holder(job_id: str) -> str:
    return ARG + job_id


def res_holder(job_id: str) -> str:
    return RES + job_id


def _oid(ref: ObjectRef | str) -> str:
    return ref if isinstance(ref, str) else ref.oid


def hold(client, refs: Iterable[ObjectRef | str], holder: str, expiry: float) -> None:
    """``holder`` holds every ref until ``expiry`` (unix time), all or none: ``ObjectMissing`` names one gone."""
    try:
        ObjectRecords(client).hold((_oid(r), holder, expiry) for r in refs)
    except ObjectGone as gone:
        raise ObjectMissing(f"object {gone.oid[:8]}... is gone from the object store (freed with gpulayer.free "
                            "or h.forget(), or every holder of it expired): it cannot be passed on; put the value "
                            "again (gpulayer.put) and pass the new ref") from None


def release(client, refs: Iterable[ObjectRef | str], holder: str, now: float | None = None) -> int:
    """``holder`` lets go of every ref; objects left with no holder are deleted now. Returns how many were."""
    now = time.time() if now is None else now
    records = ObjectRecords(client)
    return delete(records, records.release(((_oid(r), holder) for r in refs), now))


def delete(records: ObjectRecords, gone: Iterable[tuple[str, str]]) -> int:
    """Delete the bytes of objects marked deleting, then their records; one whose store fails stays marked
    (a later sweep tries again)."""
    n = 0
    for oid, store in gone:
        try:
            backend_for(store).delete(oid)
        except Exception:  # the store is down or refuses: the record stays "deleting" for the next sweep
            continue
        n += records.forget(oid)
    return n


@dataclass
class Swept:
    """What one sweep did."""

    objects: int = 0  # records looked at
    deleted: int = 0  # objects deleted (no holder left)
    orphans: int = 0  # files without a record removed
    stores: set = field(default_factory=set)


def sweep(client, now: float | None = None, stores: Iterable[str] = (), orphan_age: float = ORPHAN_AGE,
          orphans_every: float = ORPHANS_EVERY) -> Swept:
    """Prune expired holders of every object and delete what is left with none; finish deletions whose deleter
    died; remove files older than ``orphan_age`` that no record names, in ``stores`` and every store a record
    names (each listed at most every ``orphans_every`` seconds). Safe to run anywhere, any number at once."""
    now = time.time() if now is None else now
    records = ObjectRecords(client)
    out = Swept(stores={normal_url(s) for s in stores})
    for batch in records.all_oids():
        recs = records.records(batch)
        out.objects += len(batch)
        records.drop_index([oid for oid, rec in zip(batch, recs) if rec is None])
        live = [oid for oid, rec in zip(batch, recs) if rec is not None and rec.get("state") != DELETING]
        stale = [(oid, rec["store"]) for oid, rec in zip(batch, recs) if rec is not None
                 and rec.get("state") == DELETING and now - float(rec.get("deleting_at") or 0) > STALE_DELETING]
        out.stores.update(rec["store"] for rec in recs if rec is not None and rec.get("store"))
        out.deleted += delete(records, records.release(((oid, "") for oid in live), now))
        out.deleted += delete(records, stale)
    for store in sorted(out.stores):
        last = _orphans_swept.get(store)
        if last is None or time.monotonic() - last >= orphans_every:
            _orphans_swept[store] = time.monotonic()
            out.orphans += _sweep_orphans(records, store, orphan_age)
    return out


def _sweep_orphans(records: ObjectRecords, store: str, orphan_age: float) -> int:
    try:
        backend = backend_for(store)
        old = [name for name, _ in backend.list_old(orphan_age)]
    except Exception:  # a store this host cannot reach (a path only another host has): its own sweeps do it
        return 0
    n = 0
    for start in range(0, len(old), 1000):
        names = old[start: start + 1000]
        recorded = records.exists([name[:32] for name in names])
        for name, has in zip(names, recorded):
            if not has or len(name) > 32:  # no record, or a writer's leftover temporary file
                backend.delete(name)
                n += 1
    return n
