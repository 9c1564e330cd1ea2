"""A worker bootstep that runs one background loop in the worker's main process."""

from __future__ import annotations

import logging
import threading

from celery import bootsteps

log = logging.getLogger(__name__)


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
        self._blocked_on: int | None = None  # the Redis client id of the loop's blocking read, if any

    def loop(self) -> None:
        raise NotImplementedError

    def start(self, worker) -> None:
        self._thread = threading.Thread(target=self.loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def blocks_on(self, client) -> None:
        """Note that the loop waits in a blocking read (BRPOP) on ``client``'s connection; call it from the loop,
        after each (re)connect. ``stop`` then ends the read at once (``CLIENT UNBLOCK``), instead of at its
        timeout, a second later."""
        self._blocked_on = client.client_id()

    def stop(self, worker) -> None:
        self.stopping.set()
        if self._blocked_on is not None:
            self._unblock(self._blocked_on)
        if self._thread:
            self._thread.join(timeout=self.join_timeout)

    def _unblock(self, client_id: int) -> None:
        from .store.connection import connect_redis

        try:
            client = connect_redis(self.app.conf.broker_url, socket_connect_timeout=2, socket_timeout=2)
            try:
                client.client_unblock(client_id)
            finally:
                client.close()
        except Exception as err:  # noqa: BLE001  (Redis gone: the read ends at its timeout)
            log.debug("gpulayer: could not unblock %s's read: %s", self.thread_name, err)
