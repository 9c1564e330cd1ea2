"""A batch or group as a handle over its jobs: counts, the jobs as they finish, a wait for some of them.

Shared by ``BatchHandle`` (``submit_batch``) and a group's result (``cancel.JobGroupResult``), with Celery's
names and meanings where ``GroupResult`` has them (``completed_count()`` counts the jobs that *succeeded*;
``failed()``, ``successful()``, ``ready()``, ``waiting()`` are booleans) and Ray's ``wait`` semantics:

    for h in batch.as_completed(timeout=600):    # handles, as their jobs finish
        print(h.id, h.get())                     # a finished job's get() needs no round trip
    done, pending = batch.wait(5, timeout=10)    # at most 5 finished, the others (submission order)

Results are read in bulk: one pipelined MGET per look over every job not finished yet (``_CHUNK`` keys per
MGET), never a round trip per job; a finished job's result is kept (it never changes), so later looks read
only the unfinished.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from celery import states

from .deadline import Deadline

_CHUNK = 1000  # keys per MGET in one look
INTERVAL, SLOWEST = 0.02, 0.2  # seconds between looks: the first, and the longest once nothing finishes


class Sweep:
    """The mixin: a subclass gives ``_sweep_ids()`` (its job ids in submission order), ``_sweep_handle(i, meta)``
    (a handle of job ``i``, primed with its result if known), ``_sweep_backend()``, ``_sweep_timeout(pending
    ids, timeout)`` (the ``JobTimeout`` to raise) and ``_sweep_interrupted()`` (Ctrl-C's ``KeyboardInterrupt``)."""

    # -- what a subclass gives -------------------------------------------------------------------------------
    def _sweep_ids(self) -> Sequence[str]:
        raise NotImplementedError

    def _sweep_handle(self, index: int, meta: dict | None):
        raise NotImplementedError

    def _sweep_backend(self):
        raise NotImplementedError

    def _sweep_timeout(self, pending: list[str], timeout: float | None) -> Exception:
        raise NotImplementedError

    def _sweep_interrupted(self) -> KeyboardInterrupt:
        """What Ctrl-C says: the jobs run on, and how to stop them (``cancel.interrupted``)."""
        raise NotImplementedError

    # -- the kept results ------------------------------------------------------------------------------------
    def _sweep_metas(self) -> list[dict | None]:
        metas = self.__dict__.get("_metas")
        if metas is None or len(metas) != len(self._sweep_ids()):
            metas = self.__dict__["_metas"] = [None] * len(self._sweep_ids())
        return metas

    def _look(self) -> list[int]:
        """Read the results of every job not finished yet (one round trip); the indexes that finished since."""
        metas, ids = self._sweep_metas(), self._sweep_ids()
        pending = [i for i, meta in enumerate(metas) if meta is None]
        if not pending:
            return []
        backend = self._sweep_backend()
        pipe = backend.client.pipeline(transaction=False)
        for start in range(0, len(pending), _CHUNK):
            pipe.mget([backend.get_key_for_task(ids[i]) for i in pending[start:start + _CHUNK]])
        values = [v for chunk in pipe.execute() for v in chunk]
        found = []
        for i, raw in zip(pending, values):
            if raw is not None:
                meta = backend.decode_result(raw)
                if meta["status"] in states.READY_STATES:
                    metas[i] = meta
                    found.append(i)
        return found

    def _look_within(self, deadline: Deadline) -> list[int]:
        """``_look``, riding out a broker that restarts (up to a minute, never past ``deadline``), as ``get`` does."""
        from .session import BROKER_ERRORS, outage

        lost = outage(deadline, f"{len(self._sweep_ids())} jobs were sent; their results wait in Redis if the "
                                "broker comes back with its data: look again then")
        while True:
            try:
                found = self._look()
            except BROKER_ERRORS as err:
                lost.lost(err)
                continue
            lost.back()
            return found

    def _nap(self, seconds: float) -> None:
        """Sleep between looks; Ctrl-C says the jobs run on and how to stop them, without redis-py's frames."""
        try:
            time.sleep(seconds)
        except KeyboardInterrupt:
            raise self._sweep_interrupted() from None

    # -- Celery's GroupResult names ----------------------------------------------------------------------------
    def completed_count(self) -> int:
        """How many jobs *succeeded* (Celery's meaning of "completed"); ``finished_count()`` counts failures too."""
        self._look()
        return sum(1 for meta in self._sweep_metas() if meta is not None and meta["status"] == states.SUCCESS)

    def finished_count(self) -> int:
        """How many jobs finished, succeeded or failed."""
        self._look()
        return sum(1 for meta in self._sweep_metas() if meta is not None)

    def failed(self) -> bool:
        """Did any job fail (raise, or its process die)? As Celery's ``GroupResult.failed()``."""
        self._look()
        return any(meta is not None and meta["status"] != states.SUCCESS for meta in self._sweep_metas())

    def successful(self) -> bool:
        """Did every job succeed?"""
        self._look()
        return all(meta is not None and meta["status"] == states.SUCCESS for meta in self._sweep_metas())

    def ready(self) -> bool:
        """Has every job finished (succeeded or failed)?"""
        self._look()
        return all(meta is not None for meta in self._sweep_metas())

    def waiting(self) -> bool:
        """Has any job not finished yet?"""
        return not self.ready()

    def failures(self) -> list:
        """Handles of the jobs that failed so far, in submission order (``h.get()`` raises each one's error)."""
        self._look()
        return [self._sweep_handle(i, meta) for i, meta in enumerate(self._sweep_metas())
                if meta is not None and meta["status"] != states.SUCCESS]

    # -- as they finish ------------------------------------------------------------------------------------------
    def as_completed(self, timeout: float | None = None) -> Iterator:
        """Yield each job's handle as it finishes (those finished already first, in submission order); every
        job's handle is yielded once, failed ones too (their ``get()`` raises). ``timeout``: seconds for the
        whole sweep; past it, ``JobTimeout`` says how many finished and what the others are doing."""
        deadline = Deadline(timeout)
        metas = self._sweep_metas()
        given = [False] * len(metas)
        wait = INTERVAL
        while True:
            self._look_within(deadline)
            new = [i for i, meta in enumerate(metas) if meta is not None and not given[i]]
            for i in new:
                given[i] = True
                yield self._sweep_handle(i, metas[i])
            if all(given):
                return
            if deadline.expired():
                ids = self._sweep_ids()
                raise self._sweep_timeout([ids[i] for i, g in enumerate(given) if not g], timeout)
            wait = INTERVAL if new else min(wait * 1.5, SLOWEST)
            self._nap(deadline.left(wait))

    def wait(self, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        """``(done, pending)`` as Ray's ``ray.wait``: returns once ``num_returns`` jobs finished or ``timeout``
        seconds passed (``None``: no limit; ``0``: look once); ``done`` holds at most ``num_returns`` finished
        jobs' handles, ``pending`` every other job's, each in submission order. Never raises for a timeout."""
        total = len(self._sweep_ids())
        if isinstance(num_returns, bool) or not isinstance(num_returns, int) or not 0 <= num_returns <= total:
            raise ValueError(f"num_returns must be an int from 0 to the number of jobs ({total}), got {num_returns!r}")
        deadline = Deadline(timeout)
        metas = self._sweep_metas()
        wait = INTERVAL
        while True:
            new = self._look_within(deadline)
            finished = [i for i, meta in enumerate(metas) if meta is not None]
            if len(finished) >= num_returns or deadline.expired():
                break
            wait = INTERVAL if new else min(wait * 1.5, SLOWEST)
            self._nap(deadline.left(wait))
        done = set(finished[:num_returns])
        return ([self._sweep_handle(i, metas[i]) for i in sorted(done)],
                [self._sweep_handle(i, metas[i]) for i in range(total) if i not in done])
