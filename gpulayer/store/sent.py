"""Who sent which jobs, and which jobs make a batch: what `gpulayer cancel` reads (key schema in ``keys.py``).

Single jobs and a Celery group's members are recorded by the transport as they are published
(``engine/senders.py``); a ``submit_batch`` records its ids here once, in one pipeline, after its publishes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis

from . import durability, keys

_CHUNK = 10_000  # ids per ZADD / SADD


def record_batch(r: redis.Redis, identity: str, batch_id: str, ids: Sequence[str],
                 waits: durability.Durability = durability.NONE) -> int | None:
    """``ids`` were sent by ``identity`` as batch ``batch_id``; with ``waits``, then ``WAIT``: how many replicas
    confirmed these records, and so (replication keeps the primary's order) every write before them."""
    if not ids:
        return None
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        pipe.zadd(keys.client_jobs(identity), dict.fromkeys(chunk, now))
        pipe.sadd(keys.batch(batch_id), *chunk)
    pipe.expire(keys.client_jobs(identity), keys.SENT_KEEP_SECONDS)
    pipe.expire(keys.batch(batch_id), keys.SENT_KEEP_SECONDS)
    pipe.zadd(keys.BATCHES, {batch_id: now})
    pipe.sadd(keys.CLIENTS, identity)
    if waits:
        pipe.execute_command(*waits.command())
    replies = pipe.execute()
    return replies[-1] if waits else None


def batch_members(r: redis.Redis, batch_id: str) -> list[str]:
    """The job ids of batch or group ``batch_id``; empty when there is no such batch (or it expired)."""
    return sorted(m.decode() for m in r.smembers(keys.batch(batch_id)))


def sent_by(r: redis.Redis, identity: str) -> list[str]:
    """The job ids ``identity`` sent in the last day (``keys.SENT_KEEP_SECONDS``), oldest first."""
    key = keys.client_jobs(identity)
    r.zremrangebyscore(key, "-inf", time.time() - keys.SENT_KEEP_SECONDS)
    return [m.decode() for m in r.zrange(key, 0, -1)]


def forget(r: redis.Redis, identity: str, ids: Sequence[str]) -> None:
    """Drop finished jobs from ``identity``'s record, so the next look reads fewer."""
    for start in range(0, len(ids), _CHUNK):
        r.zrem(keys.client_jobs(identity), *ids[start:start + _CHUNK])


def was_sent(r: redis.Redis, job_id: str) -> bool:
    """Did any client send a job with this id in the last day (one ZSCORE per known identity)?"""
    return bool(senders_of(r, job_id))


def senders_of(r: redis.Redis, job_id: str) -> list[str]:
    """The identities whose record holds ``job_id`` (one ZSCORE per known identity). Clients write these
    records: good for saying why a cancel will be refused, never for deciding it (workers do, users/permits.py)."""
    identities = [c.decode() for c in r.smembers(keys.CLIENTS)]
    pipe = r.pipeline(transaction=False)
    for identity in identities:
        pipe.zscore(keys.client_jobs(identity), job_id)
    return [identity for identity, score in zip(identities, pipe.execute()) if score is not None]
