"""The worker's first heartbeats: from its registration, before it imports torch and starts Celery's worker, until
its ``Heartbeat`` step takes over.

Apart from ``heartbeat.py`` so that ``worker/main.py`` registers the worker having imported only what
registering needs (the Celery app, the registry): the gang agent, the control consumer and Celery's worker
machinery load after.
"""

from __future__ import annotations

import logging
import threading

from ..models import WorkerInfo
from ..store.registry import Registry

log = logging.getLogger(__name__)

_early: tuple[threading.Thread, threading.Event] | None = None


def beat_early(registry: Registry, info: WorkerInfo, interval: float) -> None:
    """Register the worker now and keep its heartbeat until the ``Heartbeat`` step takes over.

    The worker is in the registry (jobs are routed to its queues and wait there, gangs may be placed on it:
    its agent reads its orders from a list) while it imports torch and starts its pool, which takes seconds;
    ``gpulayer up`` reports the cluster ready then instead of after.
    """
    global _early
    registry.heartbeat(info)  # raises if Redis is not there: the worker does not start
    stopping = threading.Event()

    def loop():
        while not stopping.wait(interval):
            try:
                registry.heartbeat(info)
            except Exception as err:  # Redis restarting: the Heartbeat step says so if it lasts
                log.debug("gpulayer: early heartbeat failed (%s)", err)

    thread = threading.Thread(target=loop, name="gpulayer-early-heartbeat", daemon=True)
    thread.start()
    _early = (thread, stopping)


def stop_early() -> bool:
    """End the early heartbeat (the ``Heartbeat`` step's own, or the worker's exit, follows); False if none ran."""
    global _early
    early, _early = _early, None
    if early is None:
        return False
    early[1].set()
    early[0].join()
    return True
