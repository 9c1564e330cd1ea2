"""What the supervisor waits on between turns: a signal, or the exit of a process it watches.

Each watched process is a pidfd (Linux 5.3+), readable once the process has exited; signals reach the same
wait through ``signal.set_wakeup_fd``. The supervisor so sleeps until something happened, instead of waking
every few milliseconds to look. Without pidfds (another OS) the wait is a short slice, and the supervisor
looks at its processes after each.
"""

from __future__ import annotations

import os
import selectors
import signal

FALLBACK_SLICE = 0.05  # seconds between looks where processes cannot be waited on


class Events:
    """``watch(pid)`` processes, then ``wait()`` until one of them exits or a signal arrives."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.pidfds: dict[int, int] = {}  # pid -> its pidfd
        self.fallback = not hasattr(os, "pidfd_open")
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        signal.set_wakeup_fd(self._wake_w)

    def watch(self, pid: int) -> bool:
        """Wake ``wait`` when ``pid`` exits; False if it is gone already."""
        if self.fallback or pid in self.pidfds:
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:  # no pidfds on this kernel: look every slice instead
            self.fallback = True
            return True
        self.pidfds[pid] = fd
        self.selector.register(fd, selectors.EVENT_READ)
        return True

    def forget(self, pid: int) -> None:
        fd = self.pidfds.pop(pid, None)
        if fd is not None:
            self.selector.unregister(fd)
            os.close(fd)

    def wait(self, timeout: float | None = None) -> None:
        """Until a watched process exits, a signal arrives, or ``timeout`` s (a slice without pidfds)."""
        if self.fallback:
            timeout = FALLBACK_SLICE if timeout is None else min(timeout, FALLBACK_SLICE)
        self.selector.select(timeout)
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        for pid in list(self.pidfds):
            self.forget(pid)
        self.selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
