"""The janitor's round over the object store: every ``EVERY`` seconds, on one worker of the fleet at a time.

Each worker tries a lock every ``TRY_EVERY`` seconds; the one that takes it (``SET NX`` expiring after ``EVERY``
seconds, never released early) sweeps (``gpulayer/objects/``: holders past their expiry are dropped, an object
left with none is deleted, a file with no record older than an hour goes: its writer died before recording it).
The next sweep is due when the lock expires, on whichever worker takes it then: one sweep per period for the
whole fleet, wherever its workers come and go. It runs in a thread of its own, beside the janitor's: a sweep
deleting many files never delays the judgement of dead workers, nor a heartbeat.
"""

from __future__ import annotations

import logging
import time

import redis

from ..store import keys
from ..procs import runtime
from ..loopstep import LoopStep

log = logging.getLogger(__name__)
EVERY = 30.0  # seconds between sweeps, fleet-wide
TRY_EVERY = 5.0  # seconds between a worker's tries of the lock (the first try: at once)


class ObjectSweep(LoopStep):
    thread_name = "gpulayer-object-sweep"

    def loop(self) -> None:
        from ..objects import sweep

        me = runtime.current_worker().id
        client = runtime.registry.client  # the worker's client for short commands (a pool: its own connection)
        wait = 0.0
        while not self.stopping.wait(wait):
            wait = TRY_EVERY
            try:
                if client.set(keys.OBJECT_SWEEP_LOCK, me, nx=True, px=int(EVERY * 1000)):
                    sweep(client, time.time())
            except redis.RedisError as err:
                log.warning("gpulayer object sweep: %s; retrying in %.0f s", err, TRY_EVERY)
            except Exception:  # a backend that failed (a store gone away): said, and tried again next period
                log.exception("gpulayer object sweep failed; trying again in %.0f s", EVERY)
