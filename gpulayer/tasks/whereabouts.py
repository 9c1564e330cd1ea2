"""What jobs that have not finished are doing, for the message of a wait that ran out (``JobTimeout``).

``get(timeout=0.5)`` on a job says ``job 5a97... did not finish within 0.5 s: taken by worker local-2 0.4 s
ago (running there, or next for a free slot)`` or ``...: queued on gl.q.cpu (3 jobs waiting there), not taken
by a worker yet``. Read only when a wait runs out: the stored results (``unfinished``), one SCAN of the
delivery records (``holders``; ``cancel.py`` uses both) and a pipelined read of when each job was taken.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import states
from celery.exceptions import TimeoutError as CeleryTimeoutError

from .. import app as app_mod
from .. import errors
from ..engine.delivery import UNACKED_INDEX
from ..store import keys

SHOWN = 3  # workers of a batch named in its message
_CHUNK = 1000  # ids per MGET


class JobTimeout(errors.JobTimeout, CeleryTimeoutError):
    """``gpulayer.JobTimeout`` that is also Celery's ``TimeoutError``, which code written for Celery catches."""


def unfinished(ids: Sequence[str]) -> list[str]:
    """The ids among ``ids`` whose final result is not stored yet (queued, running, or never sent)."""
    backend = app_mod.app.backend
    left: list[str] = []
    for start in range(0, len(ids), _CHUNK):
        chunk = list(ids[start:start + _CHUNK])
        values = backend.client.mget([backend.get_key_for_task(i) for i in chunk])
        for job_id, raw in zip(chunk, values):
            if raw is None or backend.decode_result(raw)["status"] not in states.READY_STATES:
                left.append(job_id)
    return left


def holders(ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """``held_by_workers``, each with the delivery tag too: ``job id -> (worker id, tag)``."""
    client = app_mod.app.backend.client
    wanted, held = set(ids), {}
    prefix = keys.inflight("")
    for key in client.scan_iter(match=keys.inflight("*"), count=1000):
        worker = key.decode()[len(prefix):].rsplit(":", 1)[0]  # the life is "<worker id>:<pid>"
        for tag, job in client.hgetall(key).items():
            if job.decode() in wanted:
                held[job.decode()] = (worker, tag.decode())
    return held


def whereabouts(ids: Sequence[str]) -> dict[str, tuple[str, float | None] | None]:
    """``job id -> (worker, seconds since it took the job)`` for each of ``ids`` a worker holds (running, or
    taken ahead of a free slot), ``None`` for one still queued; finished jobs are left out."""
    client = app_mod.app.backend.client
    left = unfinished(ids)
    held = holders(left)
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for _, tag in held.values():
        pipe.zscore(UNACKED_INDEX, tag)  # when the worker took it
    now, *taken = pipe.execute()
    clock = now[0] + now[1] / 1e6
    out: dict[str, tuple[str, float | None] | None] = dict.fromkeys(left)
    for (job, (worker, _)), at in zip(held.items(), taken):
        out[job] = (worker, None if at is None else max(clock - at, 0.0))
    return out


def _queued(queue: str | None) -> str:
    """``queued on gl.q.cpu (3 jobs waiting there)``: where a job waits, and how many wait there."""
    if not queue:
        return "queued"
    waiting = app_mod.app.backend.client.llen(queue)
    return f"queued on {queue} ({waiting} job{'s' if waiting != 1 else ''} waiting there)"


def _ago(seconds: float | None) -> str:
    return "" if seconds is None else f" {seconds:.1f} s ago"


def _retrying(job_id: str) -> str:
    """``try 1 raised ConnectionError('x') on w-a; try 2: `` for a job between tries (``max_retries``), else ``""``."""
    raw = app_mod.app.backend.client.get(app_mod.app.backend.get_key_for_task(job_id))
    meta = app_mod.app.backend.decode_result(raw) if raw is not None else {}
    tries = meta.get("tries") if meta.get("status") == states.RETRY else None
    if not tries or not tries.get("outcomes"):
        return ""
    return f"try {tries['total']} raised {tries['outcomes'][-1]}; try {tries['total'] + 1}: "


def job_timeout(job_id: str, timeout: float | None, queue: str | None = None) -> JobTimeout:
    """The ``JobTimeout`` of a job's ``get(timeout)``: the job, and what it is doing."""
    try:
        where = whereabouts([job_id])
        if job_id not in where:
            doing = "it finished just now: call get() again for its result"
        elif where[job_id] is None:
            doing = f"{_queued(queue)}, not taken by a worker yet"
        else:
            worker, ago = where[job_id]
            doing = f"taken by worker {worker}{_ago(ago)} (running there, or next for a free slot)"
        doing = _retrying(job_id) + doing
    except Exception as err:  # the message is best effort: the timeout is the news
        doing = f"could not tell what it is doing ({type(err).__name__}: {err})"
    return JobTimeout(f"job {job_id} did not finish within {timeout:g} s: {doing}; it runs on: call get() again "
                      "to wait longer, or cancel() to stop it", job_id=job_id, waited=timeout)


def batch_timeout(ids: Sequence[str], pending: Sequence[str], timeout: float | None,
                  queue: str | None = None, stop: str = "cancel()") -> JobTimeout:
    """The ``JobTimeout`` of a batch's ``get(timeout)``: how many finished, and what the others are doing."""
    head = f"{len(ids) - len(pending)} of {len(ids)} jobs finished within {timeout:g} s"
    try:
        where = whereabouts(pending)
        taken = [w for w in where.values() if w is not None]
        per_worker: dict[str, int] = {}
        for worker, _ in taken:
            per_worker[worker] = per_worker.get(worker, 0) + 1
        parts = []
        if taken:
            longest = max((ago for _, ago in taken if ago is not None), default=None)
            shown = ", ".join(f"{n} on {w}" for w, n in sorted(per_worker.items())[:SHOWN])
            more = f" and {len(per_worker) - SHOWN} more workers" if len(per_worker) > SHOWN else ""
            parts.append(f"{len(taken)} taken by workers ({shown}{more}; the first{_ago(longest)})")
        if len(where) > len(taken):
            parts.append(f"{len(where) - len(taken)} {_queued(queue)}")
        note = f"; of the others, {' and '.join(parts)}" if parts else ""
    except Exception as err:
        note = f"; could not tell what the others are doing ({type(err).__name__}: {err})"
    return JobTimeout(f"{head}{note}; they run on: call get() again to wait longer, or {stop} to stop them",
                      waited=timeout)
