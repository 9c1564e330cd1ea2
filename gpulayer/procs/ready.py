"""Telling the process that started this one how far it got, over a pipe it handed down.

The starter blocks on the read end instead of polling for a state file or a registry entry, and an end of
file before the line it waits for means the process died on the way.

- The embedded cluster's supervisor writes ``ready`` to the pipe ``gpulayer up`` (or ``gpulayer.init()``)
  named with ``--ready-fd``, once its workers registered and its state file is written.
- A worker writes to the pipe named in ``GPULAYER_READY_FD`` one line per stage: ``registered`` once it is
  in the registry (jobs routed to it wait in its queues from then on), ``consuming`` once Celery takes
  messages and the worker heard its own control cast through the broker (control broadcasts reach it;
  ``worker/starting.py``).
"""

from __future__ import annotations

import os

READY_FD_ENV = "GPULAYER_READY_FD"
READY = "ready"  # a supervisor's one line
REGISTERED = "registered"
CONSUMING = "consuming"

_fd: int | None = None  # this worker's end of the pipe, once adopted


def adopt() -> None:
    """Take the pipe named in the environment (and take the name out of it: ranks and templates the worker
    starts have nothing to tell)."""
    global _fd
    try:
        _fd = int(os.environ.pop(READY_FD_ENV, ""))
    except ValueError:
        _fd = None


def tell(stage: str, last: bool = False) -> None:
    """Write ``stage`` to the parent's pipe, if one was handed down; ``last``: close it after."""
    if _fd is None:
        return
    try:
        os.write(_fd, f"{stage}\n".encode())
    except OSError:  # the parent stopped listening: nothing to tell
        pass
    if last:
        close()


def close() -> None:
    """Close the pipe (also in processes forked from the worker, which have nothing to tell)."""
    global _fd
    fd, _fd = _fd, None
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
