"""The janitor: a dead worker's messages go back to their queues at once.

Celery on Redis restores a dead consumer's unacknowledged messages only after
the visibility timeout (kept long here, so a long job is never delivered twice
while it runs). Every worker runs a janitor; a Redis lock lets one act at a
time. When a worker misses heartbeats for ``worker_dead_after`` seconds, the
janitor hands back each message that worker held (recorded by
``worker/request.py``), counting the delivery as lost; a job lost
``max_deliveries`` times fails instead, saying why.
"""

from __future__ import annotations

import json
import logging
import time

import redis
from billiard.exceptions import WorkerLostError

from ..app import settings as app_settings
from ..store import keys
from ..store.gangs import GangStore
from ..store.jobs import JobRecords
from . import runtime
from .loopstep import LoopStep

log = logging.getLogger(__name__)
INTERVAL = 1.0
ORPHAN_SWEEP_EVERY = 10  # janitor rounds between sweeps for orphaned messages


def dead_workers(client: redis.Redis, dead_after: float) -> list[str]:
    """Workers whose last heartbeat is older than ``dead_after`` seconds, by Redis's clock."""
    secs, micros = client.time()
    cutoff = secs + micros / 1e6 - dead_after
    return [w.decode() for w in client.zrangebyscore(keys.WORKERS, "-inf", cutoff)]


def hand_back(app, client: redis.Redis, worker_id: str, why: str, max_deliveries: int) -> tuple[int, int]:
    """Requeue every message ``worker_id`` held; fail the jobs lost too often. Returns (requeued, failed)."""
    records = JobRecords(client)
    held = records.held_by(worker_id)
    requeued = failed = 0
    if held:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            for tag, job_id in held.items():
                if client.hexists(channel.unacked_key, tag):  # still unacknowledged: really lost
                    lost = records.record_loss(job_id, worker_id)
                    if lost < max_deliveries:
                        channel.qos.restore_by_tag(tag)  # to the consuming end: next in line
                        requeued += 1
                    else:
                        client.pipeline().hdel(channel.unacked_key, tag).zrem(channel.unacked_index_key, tag).execute()
                        app.backend.mark_as_failure(job_id, WorkerLostError(
                            f"the job's worker died on all {lost} deliveries (limit {max_deliveries}; last on "
                            f"{worker_id}: {why}), so it was not delivered again"))
                        failed += 1
                records.release(worker_id, tag)
    return requeued, failed


def sweep_orphans(app, client: redis.Redis, older_than: float, max_deliveries: int) -> int:
    """Requeue unacknowledged messages no live worker has a record of.

    A worker killed between taking a message and recording it (a window of
    microseconds) leaves such an orphan; without this sweep it would wait for
    the visibility timeout. Only messages older than ``older_than`` seconds count.
    """
    live = [w.decode() for w in client.zrange(keys.WORKERS, 0, -1)]
    restored = 0
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        old = client.zrangebyscore(channel.unacked_index_key, "-inf", time.time() - older_than)
        for raw_tag in old:
            tag = raw_tag.decode()
            pipe = client.pipeline()
            for w in live:
                pipe.hexists(keys.inflight(w), tag)
            if any(pipe.execute()):
                continue
            payload = client.hget(channel.unacked_key, tag)
            if payload is None:
                continue
            try:
                job_id = json.loads(payload)[0]["headers"]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                job_id = None
            if job_id:
                JobRecords(client).record_loss(job_id, "unknown (orphaned message)")
            channel.qos.restore_by_tag(tag)
            restored += 1
    if restored:
        log.warning("gpulayer janitor: requeued %d orphaned message(s) no live worker held", restored)
    return restored


def bury(app, client: redis.Redis, worker_id: str, why: str, max_deliveries: int) -> None:
    """Everything a dead worker leaves: its messages, its registry entry, its slot holds and orders."""
    requeued, failed = hand_back(app, client, worker_id, why, max_deliveries)
    pipe = client.pipeline()
    pipe.zrem(keys.WORKERS, worker_id)
    pipe.hdel(keys.WORKERS_INFO, worker_id)
    pipe.execute()
    GangStore(client).forget_worker(worker_id)
    log.warning("gpulayer janitor: worker %s is dead (%s); requeued %d message(s), failed %d job(s)",
                worker_id, why, requeued, failed)


class Janitor(LoopStep):
    thread_name = "gpulayer-janitor"

    def loop(self) -> None:
        settings = app_settings()
        me = runtime.current_worker().id
        client = redis.Redis.from_url(self.app.conf.broker_url, socket_timeout=10)
        orphan_age = max(30.0, 3 * settings.worker_dead_after)
        rounds = 0
        while not self.stopping.wait(INTERVAL):
            rounds += 1
            try:
                if not client.set(keys.JANITOR_LOCK, me, nx=True, px=int(INTERVAL * 3000)):
                    continue
                try:
                    for worker_id in dead_workers(client, settings.worker_dead_after):
                        if worker_id not in dead_workers(client, settings.worker_dead_after):
                            continue  # it came back (restarted) while we looked at the others
                        bury(self.app, client, worker_id,
                             f"no heartbeat for {settings.worker_dead_after:.0f}s", settings.max_deliveries)
                    if rounds % ORPHAN_SWEEP_EVERY == 0:
                        sweep_orphans(self.app, client, orphan_age, settings.max_deliveries)
                finally:
                    if client.get(keys.JANITOR_LOCK) == me.encode():
                        client.delete(keys.JANITOR_LOCK)
            except redis.RedisError as err:
                log.warning("gpulayer janitor: %s; retrying", err)
        client.close()
