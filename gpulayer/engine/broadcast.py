"""Celery's remote control (``celery inspect``, ``app.control.ping()``), answered as soon as every worker has.

Celery waits out the whole ``timeout`` (1 s by default) for a broadcast's replies unless it is
told how many to expect (``limit=``). gpulayer knows: the workers named in ``destination``,
or else every live worker in the registry (the router's cached snapshot). So a reply-wanting
broadcast without ``limit`` gets that count; an explicit ``limit=`` or ``timeout=`` is kept,
and a ``pattern=`` (hostnames matched by the workers themselves) keeps Celery's wait.
"""

from __future__ import annotations

import logging
from typing import Callable

from celery.app import control

log = logging.getLogger(__name__)


class Control(control.Control):
    """The app's ``control``: replies are awaited until every live worker has answered, or ``timeout``."""

    #: How many workers are alive now (gpulayer.app sets it); None when unknown.
    live_workers: Callable[[], int | None] = staticmethod(lambda: None)

    def expected_replies(self, destination) -> int | None:
        if destination:
            return len(set([destination] if isinstance(destination, str) else destination))
        try:
            return self.live_workers() or None
        except Exception as err:  # the registry out of reach: Celery's own wait, the timeout
            log.debug("gpulayer: cannot count live workers for a broadcast's replies (%s)", err)
            return None

    def broadcast(self, command, arguments=None, destination=None, connection=None, reply=False, timeout=1.0,
                  limit=None, callback=None, channel=None, pattern=None, matcher=None, **extra_kwargs):
        if reply and limit is None and not pattern:
            limit = self.expected_replies(destination)
        return super().broadcast(command, arguments, destination, connection, reply, timeout, limit, callback,
                                 channel, pattern, matcher, **extra_kwargs)
