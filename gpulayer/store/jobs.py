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

    def hold(self, worker_id: str, tag: str, job_id: str) -> None:
        self.r.hset(keys.inflight(worker_id), tag, job_id)

    def release(self, worker_id: str, *tags: str) -> None:
        if tags:
            self.r.hdel(keys.inflight(worker_id), *tags)

    def held_by(self, worker_id: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.r.hgetall(keys.inflight(worker_id)).items()}

    def record_loss(self, job_id: str, worker_id: str) -> int:
        """Count one delivery of ``job_id`` that died on ``worker_id``; returns the count so far."""
        pipe = self.r.pipeline()
        pipe.incr(keys.job_lost(job_id))
        pipe.expire(keys.job_lost(job_id), KEEP_SECONDS)
        pipe.rpush(keys.job_history(job_id), json.dumps({"event": "lost", "worker": worker_id, "at": time.time()}))
        pipe.expire(keys.job_history(job_id), KEEP_SECONDS)
        return int(pipe.execute()[0])

    def record(self, job_id: str, event: str, worker_id: str) -> None:
        pipe = self.r.pipeline()
        pipe.rpush(keys.job_history(job_id), json.dumps({"event": event, "worker": worker_id, "at": time.time()}))
        pipe.expire(keys.job_history(job_id), KEEP_SECONDS)
        pipe.execute()

    def history(self, job_id: str) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(keys.job_history(job_id), 0, -1)]
