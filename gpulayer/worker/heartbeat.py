"""Worker bootstep: heartbeat capabilities and busy slots into the registry every second."""

from __future__ import annotations

import logging
import threading

from celery import bootsteps

from ..models import WorkerInfo
from ..store.registry import Registry
from ..app import settings as app_settings
from . import runtime
from .agent import ordinary_active, slots
from .request import flush_released

log = logging.getLogger(__name__)


class Heartbeat(bootsteps.StartStopStep):
    """Runs in the worker's main process, beside the consumer."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.app = worker.app
        # Not "info": that would hide the bootstep method Celery calls for `inspect stats`.
        self.worker_info: WorkerInfo = runtime.current_worker()
        self.interval: float = app_settings().heartbeat_interval
        self.registry: Registry = runtime.registry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        flush_released(self.app)
        self.registry.heartbeat(self.worker_info.model_copy(update={"busy": ordinary_active(), "held": slots.held}))

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.beat()
                if failing:
                    log.warning("gpulayer: registry reachable again; heartbeats resumed")
                failing = False
            except Exception as err:  # Redis restarting: keep trying, say so once
                if not failing:
                    log.warning("gpulayer: heartbeat failed (%s); retrying every %.1fs", err, self.interval)
                failing = True
            self._stop.wait(self.interval)

    def start(self, worker) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="gpulayer-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, worker) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        try:
            self.registry.remove(self.worker_info.id)
        except Exception as err:
            log.warning("gpulayer: could not deregister %s: %s", self.worker_info.id, err)
