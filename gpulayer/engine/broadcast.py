"""Celery's remote control (``celery inspect``, ``app.control.ping()``), answered as soon as every worker has,
and by every worker, including one that is still starting.

Celery waits out the whole ``timeout`` (1 s by default) for a broadcast's replies unless it is
told how many to expect (``limit=``). gpulayer knows: the workers named in ``destination``,
or else every live worker in the registry (the router's cached snapshot). So a reply-wanting
broadcast without ``limit`` gets that count; an explicit ``limit=`` or ``timeout=`` is kept,
and a ``pattern=`` (hostnames matched by the workers themselves) keeps Celery's wait.

A broadcast is a PUBLISH: a worker hears it only if it is subscribed when it is sent. A worker is in the
registry (and counted) from before it imports Celery's worker machinery, so one that is still starting would
miss the command, and ``inspect().stats()`` right after ``gpulayer up`` would answer without it. Such a worker
is marked starting in the registry until it heard its own control cast (``worker/starting.py``); a broadcast meant
for it waits, up to ``STARTING_WAIT`` seconds, until it is no longer marked, and is sent then.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from celery.app import control

log = logging.getLogger(__name__)

STARTING_WAIT = 30.0  # seconds a broadcast waits at most for the workers it is meant for to answer control
STARTING_POLL = 0.05  # seconds between looks at the starting workers while one is


class Control(control.Control):
    """The app's ``control``: sent once its workers answer control, replies awaited until every live worker has
    answered, or ``timeout``."""

    #: How many workers are alive now (gpulayer.app sets it; ``fresh``: not from a cache); None when unknown.
    live_workers: Callable[..., int | None] = staticmethod(lambda fresh=False: None)
    #: The ids of the live workers that do not answer control yet (gpulayer.app sets it).
    starting_workers: Callable[[], set[str]] = staticmethod(lambda: set())

    def expected_replies(self, destination, fresh: bool = False) -> int | None:
        if destination:
            return len(set([destination] if isinstance(destination, str) else destination))
        try:
            return self.live_workers(fresh=fresh) or None
        except Exception as err:  # the registry out of reach: Celery's own wait, the timeout
            log.debug("gpulayer: cannot count live workers for a broadcast's replies (%s)", err)
            return None

    def wait_for_starting(self, destination, limit: float | None = None) -> bool:
        """Until no worker the broadcast is for (``destination``'s, or any) is marked starting, or ``limit``
        seconds (default ``STARTING_WAIT``); True if it waited at all."""
        limit = STARTING_WAIT if limit is None else limit
        wanted = None
        if destination:
            names = [destination] if isinstance(destination, str) else destination
            wanted = {name.split("@", 1)[0] for name in names}  # Celery's node name is <worker id>@<host>
        end = time.monotonic() + limit
        waited = False
        while True:
            try:
                starting = self.starting_workers()
            except Exception as err:  # the registry out of reach: send now, as Celery would
                log.debug("gpulayer: cannot read the starting workers before a broadcast (%s)", err)
                return waited
            if wanted is not None:
                starting &= wanted
            if not starting:
                return waited
            if time.monotonic() >= end:
                log.warning("gpulayer: worker(s) %s still not answering control after %.0f s; broadcasting without "
                            "them", ", ".join(sorted(starting)), limit)
                return waited
            waited = True
            time.sleep(STARTING_POLL)

    def broadcast(self, command, arguments=None, destination=None, connection=None, reply=False, timeout=1.0,
                  limit=None, callback=None, channel=None, pattern=None, matcher=None, *,
                  wait_starting: bool = True, **extra_kwargs):
        """Celery's broadcast, sent once the workers it is for answer control (``wait_starting=False``: at once,
        what a worker's cast to itself while it starts uses), awaiting as many replies as there are live workers."""
        waited = self.wait_for_starting(destination) if wait_starting else False
        if reply and limit is None and not pattern:
            limit = self.expected_replies(destination, fresh=waited)
        return super().broadcast(command, arguments, destination, connection, reply, timeout, limit, callback,
                                 channel, pattern, matcher, **extra_kwargs)


HEARD = "gpulayer_heard"  # the control command a starting worker casts to itself (worker/starting.py)
_listening: dict[str, threading.Event] = {}  # token -> set when this process's worker hears the cast carrying it


def _heard(state, token=None):
    """A starting worker's cast to itself came back through the broker: it hears control broadcasts."""
    event = _listening.get(token)
    if event is not None:
        event.set()


def listen_for_own_cast(token: str) -> threading.Event:
    """In a worker's main process: an event set once its event loop hears the ``HEARD`` cast carrying ``token``."""
    from celery.worker import control

    if HEARD not in control.Panel.data:
        control.control_command(name=HEARD)(_heard)
    return _listening.setdefault(token, threading.Event())


def cast_to_self(app, connection, nodename: str, token: str) -> None:
    """Cast ``HEARD`` to ``nodename``, published on ``connection`` (not through Celery's producer pool, whose
    connections stay open after), asking no reply (a worker replies through that pool)."""
    mailbox = app.control.Mailbox(app.conf.control_exchange, type="fanout", accept=app.conf.accept_content,
                                  serializer=app.conf.task_serializer)
    mailbox(connection).cast([nodename], HEARD, {"token": token})
