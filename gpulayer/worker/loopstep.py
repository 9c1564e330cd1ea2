"""A worker bootstep that runs one background loop in the worker's main process."""

from __future__ import annotations

import threading

from celery import bootsteps


class LoopStep(bootsteps.StartStopStep):
    """Subclasses write ``loop()``, which runs until ``self.stopping`` is set.

    Started after the pool, stopped with the worker. Attribute names avoid
    ``info``: that would hide the method Celery calls for ``inspect stats``.
    """

    requires = {"celery.worker.components:Pool"}
    thread_name = "gpulayer-loop"
    join_timeout = 3.0

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.app = worker.app
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def loop(self) -> None:
        raise NotImplementedError

    def start(self, worker) -> None:
        self._thread = threading.Thread(target=self.loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, worker) -> None:
        self.stopping.set()
        if self._thread:
            self._thread.join(timeout=self.join_timeout)
