"""Per-job reliability records: deliveries lost, history, and who holds which message."""

from __future__ import annotations

import json
import time

import redis

from . import keys

KEEP_SECONDS = 7 * 86400


class JobRecords:
    def __init__(self, client: redis.Redis):
        self.r = client

    def release(self, life: str, *tags: str) -> int:
        """Drop records; returns how many existed (1 for one tag: this caller took the record, no one else)."""
        return int(self.r.hdel(keys.inflight(life), *tags)) if tags else 0

    def held_by(self, life: str) -> dict[str, str]:
        """Delivery tag -> job id of every message one worker life holds (``keys.life``)."""
        return {k.decode(): v.decode() for k, v in self.r.hgetall(keys.inflight(life)).items()}

    def lives(self, worker_id: str) -> list[str]:
        """Every life of ``worker_id`` that still has delivery records."""
        found = set()
        prefix = keys.inflight("")
        for key in self.r.scan_iter(match=keys.lives_of(worker_id), count=1000):
            life = key.decode()[len(prefix):]
            if life[len(worker_id) + 1:].isdigit():
                found.add(life)
        return sorted(found)

    def record_loss(self, job_id: str, worker_id: str) -> int:
        """Count one delivery of ``job_id`` that died on ``worker_id``; returns the count so far."""
        pipe = self.r.pipeline()
        pipe.incr(keys.job_lost(job_id))
        pipe.expire(keys.job_lost(job_id), KEEP_SECONDS)
        pipe.rpush(keys.job_history(job_id), json.dumps({"event": "lost", "worker": worker_id, "at": time.time()}))
        pipe.expire(keys.job_history(job_id), KEEP_SECONDS)
        return int(pipe.execute()[0])

    def losses(self, job_id: str) -> int:
        """How many deliveries of ``job_id`` died so far."""
        return int(self.r.get(keys.job_lost(job_id)) or 0)

    def record(self, job_id: str, event: str, worker_id: str, **detail) -> None:
        """Add ``event`` on ``worker_id`` (and ``detail``: a retry's attempt, error and delay) to the job's history."""
        pipe = self.r.pipeline()
        pipe.rpush(keys.job_history(job_id), json.dumps({"event": event, "worker": worker_id, "at": time.time(),
                                                         **detail}))
        pipe.expire(keys.job_history(job_id), KEEP_SECONDS)
        pipe.execute()

    def history(self, job_id: str) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(keys.job_history(job_id), 0, -1)]
