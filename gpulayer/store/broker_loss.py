"""A lost broker, said plainly: ``ClusterUnavailable`` naming the broker (password masked), what was in flight
and what to do, and a waiter that rides out a short outage (a Redis restart) before it says so.

Every client path that talks to Redis (a submit, a handle's ``get``, a batch's or a group's, a distributed
job's watcher, ``gpulayer status``) catches :data:`LOST` (``session.BROKER_ERRORS`` adds kombu's wrapper of
them) and turns it into :func:`unavailable`'s error. One that waits::

    outage = Outage(url, Deadline(timeout), lambda: f"{sent} jobs sent, {done} finished")
    while True:
        try:
            values = client.mget(keys)
        except LOST as err:
            outage.lost(err)  # waits a moment and returns (Redis may be restarting), or raises ClusterUnavailable
            continue
        outage.back()
        ...
"""

from __future__ import annotations

import time
from typing import Callable

import redis

from ..deadline import Deadline
from ..errors import ClusterUnavailable
from ..masking import mask_url

# What redis-py raises for a broker that went away, refuses connections, is still loading its data, or
# refuses our password (AuthenticationError and BusyLoadingError are ConnectionErrors).
LOST: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)

PATIENCE = 60.0  # seconds a waiter rides out an unreachable broker (never past its own timeout) before it says so
RETRY_EVERY = 0.2  # seconds between its tries meanwhile


def unavailable(url: str | None, err: BaseException | None, in_flight: str | None = None,
                lost_for: float | None = None, note: str | None = None) -> ClusterUnavailable:
    """The error for a lost or refused connection to the broker at ``url``.

    ``in_flight``: what the call was doing (``"100 jobs sent, 32 finished"``); ``lost_for``: seconds it waited
    for the broker to come back; ``note``: what else is known (the embedded cluster's own account of its end).
    """
    where = mask_url(url) if url else "(no broker URL)"
    cause = f" ({' '.join(str(err).split()) or type(err).__name__})" if err is not None else ""
    state = f"has been unreachable for {lost_for:.0f} s" if lost_for else "is unreachable"
    if isinstance(err, redis.AuthenticationError):
        fix = "check the password in GPULAYER_BROKER_URL (or the config file) against the Redis's requirepass"
    else:
        fix = ("start the broker again (`gpulayer up` for the embedded cluster, the fleet's Redis otherwise) or point "
               "GPULAYER_BROKER_URL at the right one, then retry: jobs already sent wait in its queues if it comes "
               "back with its data")
    parts = [f"the broker {where} {state}{cause}", in_flight, note, fix]
    return ClusterUnavailable("; ".join(p for p in parts if p))


class Outage:
    """A waiter's view of a lost broker: :meth:`lost` after each failed call, :meth:`back` after a good one.

    ``lost`` sleeps a moment and returns while the broker has been away for less than ``patience`` seconds
    and ``deadline`` has not passed (the caller then tries again); after that it raises :func:`unavailable`'s
    error, from the last failure, and at once when ``note`` has something to say (the embedded cluster's
    account of why it stopped for good). ``in_flight`` is called only then, for the message.
    """

    def __init__(self, url: str | None, deadline: Deadline | None = None,
                 in_flight: Callable[[], str | None] | str | None = None, patience: float = PATIENCE,
                 note: Callable[[], str | None] | None = None):
        self.url = url
        self.deadline = deadline or Deadline(None)
        self.in_flight = in_flight
        self.patience = patience
        self.note = note
        self.since: float | None = None  # monotonic time of the first failure of this outage
        self.last: BaseException | None = None  # its latest failure

    def lost(self, err: BaseException) -> None:
        now = time.monotonic()
        self.last = err
        if self.since is None:
            self.since = now
        # (A note means the embedded cluster stopped for good: nothing to wait for.)
        if self.deadline.expired() or now - self.since >= self.patience or (self.note and self.note()):
            raise self.error(err) from err
        time.sleep(max(0.0, min(self.deadline.left(RETRY_EVERY), self.since + self.patience - now)))

    def error(self, err: BaseException | None = None) -> ClusterUnavailable:
        """The error to raise now: for ``err``, else this outage's latest failure."""
        in_flight = self.in_flight() if callable(self.in_flight) else self.in_flight
        lost_for = time.monotonic() - self.since if self.since is not None else None
        return unavailable(self.url, err or self.last, in_flight, lost_for, self.note() if self.note else None)

    def back(self) -> None:
        self.since = None

    @property
    def ongoing(self) -> bool:
        return self.since is not None
