"""The janitor: a dead worker's messages go back to their queues at once.

Celery on Redis restores a dead consumer's unacknowledged messages only after
the visibility timeout (kept long here, so a long job is never delivered twice
while it runs). Every worker runs a janitor; a Redis lock lets one act at a
time. When a worker misses heartbeats for ``worker_dead_after`` seconds, the
janitor hands back each message that worker held (recorded as it was taken,
``gpulayer/engine/transport.py``), counting the delivery as lost (a job lost
``max_deliveries`` times fails instead, saying why).
"""

from __future__ import annotations

import logging
import time

import redis
from billiard.exceptions import WorkerLostError

from ..app import settings as app_settings
from ..engine import envelope
from ..engine.delivery import unacked
from ..gang.coordinator import audit_after_failover, worker_lost
from ..store import keys
from ..store import reconcile
from ..store.gangs import GangStore
from ..store.jobs import JobRecords
from ..store.registry import Registry
from ..procs import runtime
from ..loopstep import LoopStep

log = logging.getLogger(__name__)
INTERVAL = 1.0
ORPHAN_SWEEP_EVERY = 10  # janitor rounds between sweeps for orphaned messages


def hand_back(app, client: redis.Redis, life: str, why: str, max_deliveries: int) -> tuple[int, int]:
    """Requeue every message one worker life held; fail the jobs lost too often. Returns (requeued, failed)."""
    records = JobRecords(client)
    worker_id = life.rsplit(":", 1)[0]
    requeued = failed = 0
    held = records.held_by(life)
    if held:
        with unacked(app) as deliveries:
            for tag, job_id in held.items():
                if not records.release(life, tag):
                    continue  # another janitor (or the restarted worker itself) is handing this one back
                if deliveries.holds(client, tag):  # still unacknowledged: really lost
                    lost = records.record_loss(job_id, worker_id)
                    if lost < max_deliveries:
                        deliveries.give_back(tag)  # to the consuming end: next in line
                        requeued += 1
                    else:
                        deliveries.drop(client, tag)
                        app.backend.mark_as_failure(job_id, WorkerLostError(
                            f"the job's worker died on all {lost} deliveries (limit {max_deliveries}; last on "
                            f"{worker_id}: {why}), so it was not delivered again"))
                        failed += 1
    return requeued, failed


def hand_back_lives(app, client: redis.Redis, worker_id: str, why: str, max_deliveries: int,
                    keep: str | None = None) -> tuple[int, int]:
    """Hand back what every life of ``worker_id`` but ``keep`` held (a restarted worker, for its earlier lives)."""
    requeued = failed = 0
    for life in JobRecords(client).lives(worker_id):
        if life != keep:
            r, f = hand_back(app, client, life, why, max_deliveries)
            requeued, failed = requeued + r, failed + f
    return requeued, failed


def sweep_orphans(app, client: redis.Redis, older_than: float, max_deliveries: int) -> int:
    """Requeue unacknowledged messages no live worker has a record of.

    Workers record each message in the same step as kombu's unacked entry
    (gpulayer/engine/transport.py), so only a consumer that is not a gpulayer worker (or a
    record lost with Redis's last writes) leaves such an orphan; without this
    sweep it would wait for the visibility timeout. Only messages older than
    ``older_than`` seconds count.
    """
    registry = Registry(client)
    live = [registry.life(w) for w in registry.ages()]  # every worker it holds, dead or not
    live = [life for life in live if life]
    restored = 0
    with unacked(app) as deliveries:
        for tag in deliveries.older_than(client, time.time() - older_than):
            pipe = client.pipeline()
            for life in live:
                pipe.hexists(keys.inflight(life), tag)
            if any(pipe.execute()):
                continue
            message = deliveries.message(client, tag)
            if message is None:
                continue
            job_id = envelope.job_id(message)
            if job_id:
                JobRecords(client).record_loss(job_id, "unknown (orphaned message)")
            deliveries.give_back(tag)
            restored += 1
    if restored:
        log.warning("gpulayer janitor: requeued %d orphaned message(s) no live worker held", restored)
    return restored


def bury(app, client: redis.Redis, worker_id: str, life: str | None, why: str, max_deliveries: int) -> None:
    """Everything a dead worker leaves: its messages, its registry entry, its slot holds and orders.

    ``life`` is the dead life, read before the worker was judged dead: a new life that starts meanwhile
    under the same name keeps what it takes. Without it (no registry entry), every life is handed back.
    """
    if life is not None:
        requeued, failed = hand_back(app, client, life, why, max_deliveries)
    else:
        requeued, failed = hand_back_lives(app, client, worker_id, why, max_deliveries)
    reconcile.forget(client, worker_id)  # a dead worker has nothing to re-assert after a failover
    Registry(client).remove(worker_id)  # every record of it: liveness, info, static, load, change marks
    worker_lost(client, worker_id, why)  # its gang nodes fail and give their slots back; waiting gangs are tried
    GangStore(client).forget_worker(worker_id)
    log.warning("gpulayer janitor: worker %s is dead (%s); requeued %d message(s), failed %d job(s)",
                worker_id, why, requeued, failed)


class Janitor(LoopStep):
    thread_name = "gpulayer-janitor"

    def loop(self) -> None:
        settings = app_settings()
        me = runtime.current_worker().id
        registry = runtime.registry  # the worker's, with its death line (worker_dead_after)
        client = registry.client  # the worker's one client for short commands, shared with the heartbeat
        dead_after = registry.dead_after
        orphan_age = max(30.0, 3 * dead_after)
        rounds = 0
        lagging = switching = False
        audited = None
        while not self.stopping.wait(INTERVAL):
            rounds += 1
            try:
                if not client.set(keys.JANITOR_LOCK, me, nx=True, px=int(INTERVAL * 3000)):
                    continue
                try:
                    epoch = reconcile.primary_epoch(client)
                    if reconcile.switched_within(client, dead_after) is not None:
                        # The broker just failed over (or restarted): the heartbeats on this primary are as old
                        # as the switch, not the workers' silence. Nobody is dead until they had time to beat.
                        if not switching:
                            log.warning("gpulayer janitor: the broker's primary is new; judging no worker dead "
                                        "for %.0f s while the workers reconnect", dead_after)
                        switching = True
                        continue
                    switching = False
                    if audited != epoch and (not reconcile.late(client, epoch, sorted(registry.live_ids()))
                                             or reconcile.epoch_age(client, epoch) >= reconcile.RECONCILE_WAIT):
                        if audit_after_failover(client, epoch) is not None:  # nodes of running gangs lost with the old primary
                            audited = epoch
                    dead = registry.dead()
                    if me in dead:  # our own beats are missing: the registry lags (a broker failover), not them
                        if not lagging:
                            log.warning("gpulayer janitor: this worker's own heartbeats are missing from the "
                                        "registry (the broker failed over?); judging no worker dead until they show")
                        lagging = True
                        continue
                    lagging = False
                    for worker_id in dead:
                        life = registry.life(worker_id)  # before the re-check: see bury()
                        if worker_id not in registry.dead():
                            continue  # it came back (restarted) while we looked at the others
                        bury(self.app, client, worker_id, life,
                             f"no heartbeat for {dead_after:.0f}s", settings.max_deliveries)
                    if rounds % ORPHAN_SWEEP_EVERY == 0:
                        sweep_orphans(self.app, client, orphan_age, settings.max_deliveries)
                finally:
                    if client.get(keys.JANITOR_LOCK) == me.encode():
                        client.delete(keys.JANITOR_LOCK)
            except redis.RedisError as err:
                log.warning("gpulayer janitor: %s; retrying", err)
