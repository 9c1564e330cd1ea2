"""Worker bootstep: heartbeat capabilities and busy slots into the registry every second."""

from __future__ import annotations

import logging

from .. import signing
from ..app import redis_client, settings as app_settings
from ..store.connection import client_name
from ..models import WorkerInfo
from ..store.reconcile import forget, primary_epoch
from ..store.registry import Registry
from ..gang.reconcile import reassert_worker
from ..procs import runtime
from ..gang.agent import ordinary_active, slots
from .early import stop_early
from .starting import answered
from ..loopstep import LoopStep

log = logging.getLogger(__name__)

class Heartbeat(LoopStep):
    """Runs in the worker's main process, beside the consumer."""

    thread_name = "gpulayer-heartbeat"
    # After the gang agent: the worker is advertised only once it can take gang orders, and (steps stop in
    # reverse) it leaves the registry before the agent stops its gangs, so a gang restarted on the way out
    # is placed on live workers, not on this one.
    requires = LoopStep.requires | {"gpulayer.gang.agent:GangAgent"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.worker_info: WorkerInfo = runtime.current_worker()
        settings = app_settings()
        self.interval: float = settings.heartbeat_interval
        # A connection of its own: behind the janitor's commands on the shared one, a starved host
        # (30 machines on 2 cores starting 32 ranks) kept heartbeats waiting 2-6 s for it, and
        # gangs failed on workers judged dead that were alive.
        self.client = redis_client(name=client_name(self.worker_info.id, "heartbeat"), one_connection=True)
        self.registry: Registry = Registry(self.client, settings.worker_dead_after)
        self.epoch: str | None = None  # the primary this worker last re-asserted its slots on (store/reconcile.py)

    def beat(self) -> None:
        epoch = primary_epoch(self.client)
        if epoch != self.epoch:  # a new primary (a failover, a restart) may lack our last writes: before beating
            held = reassert_worker(self.client, self.worker_info.id, epoch)
            if self.epoch is not None:
                log.warning("gpulayer: the broker's primary changed; re-asserted this worker's registry entry "
                            "and its %d gang-held slot(s) there", held)
                if answered():  # a mark the new primary kept from before this worker answered: no broadcast waits
                    self.registry.mark_answering(self.worker_info.id)
            self.epoch = epoch
        self.registry.heartbeat(self.worker_info.model_copy(update={"busy": ordinary_active(), "held": slots.held}))
        # The user table, read at least every users/table.py TTL whether or not a message comes: a revocation is
        # seen within it, and kept for this process's life (UsersCache._sticky) if an older entry comes back.
        users = signing.users()
        if users is not None:
            users.entries()

    def loop(self) -> None:
        failing = False
        while not self.stopping.is_set():
            try:
                self.beat()
                if failing:
                    log.warning("gpulayer: registry reachable again; heartbeats resumed")
                failing = False
            except Exception as err:  # Redis restarting: keep trying, say so once
                if not failing:
                    log.warning("gpulayer: heartbeat failed (%s); retrying every %.1fs", err, self.interval)
                failing = True
            self.stopping.wait(self.interval)

    def start(self, worker) -> None:
        stop_early()
        self.beat()  # registered before the consumer takes its first message
        super().start(worker)

    def stop(self, worker) -> None:
        super().stop(worker)
        try:
            self.registry.remove(self.worker_info.id)
            forget(self.client, self.worker_info.id)
        except Exception as err:
            log.warning("gpulayer: could not deregister %s: %s", self.worker_info.id, err)
        finally:
            self.client.close()
