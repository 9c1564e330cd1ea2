"""Worker bootstep: a signal wakes the worker's event loop at once.

Celery's SIGTERM handler only marks the worker as stopping; the loop sees the mark when its poll returns,
which on an idle worker is up to a second later (kombu's ``Hub`` polls with its next timer's delay). Here
every signal also writes to a pipe the loop reads (``signal.set_wakeup_fd``), so ``gpulayer down`` and a
supervisor's SIGTERM start the warm shutdown in milliseconds. Only public APIs: ``Hub.add_reader`` and
``signal.set_wakeup_fd``.
"""

from __future__ import annotations

import os
import signal

from celery import bootsteps


class WakeOnSignal(bootsteps.StartStopStep):
    requires = {"celery.worker.components:Hub"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.fds: tuple[int, int] | None = None

    def start(self, worker) -> None:
        hub = getattr(worker, "hub", None)
        if hub is None:  # no event loop (a pool without one): nothing to wake
            return
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self.fds = (read, write)
        signal.set_wakeup_fd(write)
        hub.add_reader(read, self._drain, read)

    @staticmethod
    def _drain(fd: int) -> None:
        try:
            while os.read(fd, 512):
                pass
        except BlockingIOError:
            pass

    def stop(self, worker) -> None:
        if self.fds is not None:
            signal.set_wakeup_fd(-1)


def forget_in_child() -> None:
    """In a process forked from the worker (a pool process): its signals are its own, not the loop's."""
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # not the main thread
        pass
