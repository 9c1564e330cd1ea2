"""Waiting with a limit: ``Deadline`` (a point in time) and ``wait_until`` (poll a condition until it holds).

The one way gpulayer waits for something with a time limit, on the monotonic clock::

    deadline = Deadline(timeout)            # None: no limit
    while not done():
        if deadline.expired():
            raise TimeoutError(...)
        event.wait(deadline.left(0.05))     # a slice of at most 0.05 s, never past the deadline

    value = wait_until(lambda: store.master(gang), 120, "node 0's address")
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class Deadline:
    """``seconds`` from now on the monotonic clock; ``Deadline(None)`` never expires."""

    __slots__ = ("seconds", "at")

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float | None:
        """Seconds left, never negative; None without a limit."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        """True once the deadline has passed (never without a limit)."""
        return self.at is not None and time.monotonic() > self.at

    def left(self, most: float) -> float:
        """The next wait's length: ``most`` seconds, or less if the deadline comes first (never negative)."""
        remaining = self.remaining()
        return most if remaining is None else min(most, remaining)


def poll(predicate: Callable[[], T], timeout: float | None, every: float = 0.02) -> T:
    """Call ``predicate`` every ``every`` s until it returns something truthy or ``timeout`` s have passed;
    return its last value (falsy when time ran out)."""
    deadline = Deadline(timeout)
    while True:
        value = predicate()
        if value or deadline.expired():
            return value
        time.sleep(every)


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, what: str = "the condition",
               every: float = 0.02) -> T:
    """Call ``predicate`` until it returns something truthy, and return that; ``TimeoutError`` naming ``what``.

    Wait for a state instead of sleeping a fixed time and hoping.
    """
    value = poll(predicate, timeout, every)
    if not value:
        raise TimeoutError(f"{what} did not happen within {timeout:g} s")
    return value
