"""Worker bootstep: heartbeat capabilities and busy slots into the registry every second."""

from __future__ import annotations

import logging

from ..app import settings as app_settings
from ..models import WorkerInfo
from ..store.registry import Registry
from . import runtime
from ..gang.agent import ordinary_active, slots
from .loopstep import LoopStep

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
        self.interval: float = app_settings().heartbeat_interval
        self.registry: Registry = runtime.registry

    def beat(self) -> None:
        self.registry.heartbeat(self.worker_info.model_copy(update={"busy": ordinary_active(), "held": slots.held}))

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
        self.beat()  # registered before the consumer takes its first message
        super().start(worker)

    def stop(self, worker) -> None:
        super().stop(worker)
        try:
            self.registry.remove(self.worker_info.id)
        except Exception as err:
            log.warning("gpulayer: could not deregister %s: %s", self.worker_info.id, err)
