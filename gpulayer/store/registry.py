"""The worker registry: heartbeats in, snapshots of live workers out."""

from __future__ import annotations

import threading
import time
from importlib import resources as _res

import redis

from ..models import WorkerInfo
from . import keys


def load_script(client: redis.Redis, name: str):
    """A registered Lua script from ``store/lua/<name>.lua``."""
    return client.register_script(_res.files(__package__).joinpath("lua", f"{name}.lua").read_text())


class Registry:
    """Who is alive, judged by Redis's clock."""

    def __init__(self, client: redis.Redis, dead_after: float = 5.0):
        self.client = client
        self.dead_after = dead_after
        self._beat = load_script(client, "heartbeat")
        self._snap = load_script(client, "snapshot")

    def heartbeat(self, info: WorkerInfo) -> None:
        self._beat(keys=[keys.WORKERS, keys.WORKERS_INFO], args=[info.id, info.model_dump_json()])

    def remove(self, worker_id: str) -> None:
        pipe = self.client.pipeline()
        pipe.zrem(keys.WORKERS, worker_id)
        pipe.hdel(keys.WORKERS_INFO, worker_id)
        pipe.execute()

    def snapshot(self) -> tuple[WorkerInfo, ...]:
        """Every live worker, sorted by id, each with its heartbeat age."""
        raw = self._snap(keys=[keys.WORKERS, keys.WORKERS_INFO], args=[self.dead_after])
        now = float(raw[0])
        workers = []
        for score, info in zip(raw[1::2], raw[2::2]):
            w = WorkerInfo.model_validate_json(info)
            workers.append(w.model_copy(update={"heartbeat_age": max(0.0, now - float(score))}))
        return tuple(sorted(workers, key=lambda w: w.id))


class CachedSnapshot:
    """A registry snapshot reused for ``ttl`` seconds (the router's view of the fleet)."""

    def __init__(self, registry: Registry, ttl: float = 1.0):
        self.registry = registry
        self.ttl = ttl
        self._at = float("-inf")
        self._value: tuple[WorkerInfo, ...] = ()
        self._lock = threading.Lock()

    def get(self) -> tuple[WorkerInfo, ...]:
        with self._lock:
            if time.monotonic() - self._at > self.ttl:
                self._value = self.registry.snapshot()
                self._at = time.monotonic()
            return self._value

    def invalidate(self) -> None:
        with self._lock:
            self._at = float("-inf")
