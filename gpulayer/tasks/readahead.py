"""Reading the results of many ``submit.delay`` jobs with few round trips: ``[h.get() for h in handles]``.

Each ``JobHandle.get`` used to read its own stored result with one GET: a round trip per job, as much of
a tiny job's client CPU as sending it. A handle that reads its result now reads, in the same MGET, the
results of up to ``WINDOW`` other jobs this process sent with ``delay`` and has not read yet (the oldest
first: jobs finish roughly in the order they were sent). Each one found finished is kept here until its
own handle asks for it, which then needs no round trip.

Only final results are kept (success or failure: stored once, never overwritten, ``store_once.lua``), each
decoded as its handle would decode it, and only small ones (``KEEP_BYTES``), at most ``KEEP`` of them: a
process that drops its handles unread keeps a bounded number of results, the oldest dropped first.

A job not finished yet is waited for on its result channel (Celery's subscription): three round trips of its
own. While other jobs this process sent are unread (a loop over many handles, running behind the workers),
its ``get`` first polls its own result for ``SPIN`` seconds (:func:`wait_briefly`): a loop that overtakes the
workers then costs a round trip per poll (a GET's worth), not three per job; a long job costs
``SPIN / SPIN_EVERY`` polls more before the usual wait.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from celery import states

from ..deadline import Deadline, poll

WINDOW = 256  # other unread jobs read along with one handle's own result
SPIN, SPIN_EVERY = 0.05, 0.002  # seconds an unfinished job's get polls, and between polls, while others are unread
KEEP = 10_000  # results kept for handles that have not asked yet; also the unread jobs remembered
KEEP_BYTES = 4096  # a bigger result is left in Redis for its own handle (at most KEEP x this, 40 MB, kept)

_lock = threading.Lock()
_owner: tuple[int, int] = (0, 0)  # (pid, id of the result backend) the records below belong to
_unread: OrderedDict[str, None] = OrderedDict()  # jobs sent by this process, not read yet, oldest first
_kept: OrderedDict[str, dict] = OrderedDict()  # job id -> its final meta, read ahead


def _mine(backend) -> None:
    """Forget what a parent process remembered (a fork sees its parent's handles, not their results), or what
    this one sent to another cluster (connected anew)."""
    global _owner
    if _owner != (os.getpid(), id(backend)):
        _owner = os.getpid(), id(backend)
        _unread.clear()
        _kept.clear()


def sent(backend, job_id: str) -> None:
    """This process sent ``job_id`` and holds its handle."""
    with _lock:
        _mine(backend)
        _unread[job_id] = None
        if len(_unread) > KEEP:
            _unread.popitem(last=False)


def forget(job_id: str) -> None:
    """``job_id``'s result is gone (``handle.forget()``): keep nothing of it."""
    with _lock:
        _unread.pop(job_id, None)
        _kept.pop(job_id, None)


def meta(backend, job_id: str, window: int = WINDOW) -> dict:
    """``job_id``'s stored meta, as ``backend.get_task_meta`` gives it; reads up to ``window`` others' results
    along with it."""
    with _lock:
        _mine(backend)
        found = _kept.pop(job_id, None)
        if found is not None:
            return found
        _unread.pop(job_id, None)  # its handle waits for it now
        others = [i for i, _ in zip(_unread, range(window))]
    ids = [job_id, *others]
    raws = backend.client.mget([backend.get_key_for_task(i) for i in ids])
    own = backend.decode_result(raws[0]) if raws[0] is not None else {"status": states.PENDING, "result": None}
    done = {}
    for other, raw in zip(others, raws[1:]):
        if raw is not None and len(raw) <= KEEP_BYTES:
            try:
                decoded = backend.decode_result(raw)
            except Exception:  # (one this process cannot open, e.g. sealed to another user): its own get says why
                continue
            if decoded.get("status") in states.READY_STATES:
                done[other] = decoded
    if done:
        with _lock:
            for other, decoded in done.items():
                if other in _unread:  # (not read meanwhile by its own handle, nor forgotten)
                    del _unread[other]
                    _kept[other] = decoded
            while len(_kept) > KEEP:
                _kept.popitem(last=False)
    return own


def others_unread() -> bool:
    """Are there jobs this process sent whose results no handle has read yet?"""
    return bool(_unread)


def wait_briefly(backend, job_id: str, deadline: Deadline) -> dict:
    """``job_id``'s meta after polling up to ``SPIN`` seconds (never past ``deadline``) for it to be final."""
    last = [{"status": states.PENDING, "result": None}]

    def final() -> bool:  # its own result only: the others' are read by the next get, once this one is in
        last[0] = meta(backend, job_id, 0)
        return last[0].get("status") in states.READY_STATES

    poll(final, deadline.left(SPIN), SPIN_EVERY)
    return last[0]
