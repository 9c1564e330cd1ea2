"""``gpulayer logs ID [-f] [--rank R]``: what a job or a distributed job's ranks printed, as kept.

A job keeps its newest lines (up to 1 MiB) as long as its result (gpulayer/output/). Its stdout lines go to
this command's stdout, every other line to its stderr, as `docker logs` does. ``-f`` prints the lines as they
come until the job ends. For a distributed job, every rank's lines rank by rank (each prefixed ``(rank R)``),
or ``--rank R``'s alone. Exit status 1 for an id that names nothing sent in the last day.
"""

from __future__ import annotations

import sys

from celery import states

from ..errors import AmbiguousId
from .cluster import connected_client


def logs(job_id: str, follow: bool = False, rank: int | None = None, out=None, err=None) -> int:
    """The ``gpulayer logs`` command; returns its exit status."""
    from .. import app as app_mod
    from ..models import GangState
    from ..output import tail
    from ..output.lines import OUT
    from ..store import keys
    from ..store.gangs import GangStore
    from ..store.sent import was_sent

    out, err = out or sys.stdout, err or sys.stderr
    r = connected_client("read from")
    try:
        job_id = _full_id(r, job_id)
    except AmbiguousId as exc:
        print(f"gpulayer logs: {exc}", file=err)
        return 1
    store = GangStore(r)
    rec = store.record(job_id)
    if rec["state"] is not None:  # a distributed job
        world = store.spec(job_id).world_size
        if rank is not None and not 0 <= rank < world:
            print(f"gpulayer logs: distributed job {job_id} has ranks 0 to {world - 1}, not {rank}", file=err)
            return 2
        ranks = [rank] if rank is not None else list(range(world))

        def done() -> bool:
            return store.record(job_id)["state"] not in (GangState.WAITING.value, GangState.RUNNING.value)
    else:
        if rank is not None:
            print(f"gpulayer logs: {job_id} is a job, not a distributed job: it has no ranks (leave out --rank)",
                  file=err)
            return 2
        ranks = [None]
        status = app_mod.app.backend.get_task_meta(job_id)["status"]
        if status == states.PENDING and not r.exists(keys.job_output(job_id)) and not was_sent(r, job_id):
            print(f"gpulayer logs: unknown id {job_id}: no job or distributed job with this id was sent in the "
                  "last day (a finished job's output expires with its result)", file=err)
            return 1

        def done() -> bool:
            return app_mod.app.backend.get_task_meta(job_id)["status"] in states.READY_STATES

    tagged = len(ranks) > 1
    if follow:
        lines = tail.follow(r, job_id, ranks, done=done)
    else:
        lines = ((rk, s, t) for rk in ranks for _, s, t in tail.entries(r, job_id, rk))
    for rk, stream, text in lines:
        print(f"(rank {rk}) {text}" if tagged else text, file=out if stream == OUT else err, flush=follow)
    return 0


def _full_id(r, given: str) -> str:
    """The whole id a unique prefix (at least 6 characters) names (gpulayer/ids.py); ``given`` itself where
    nothing is found, so the caller's own check says it is unknown. ``AmbiguousId`` passes through."""
    from ..errors import AmbiguousId, UnknownId
    from ..ids import resolve

    try:
        return resolve(given, kinds=("gang", "job"), r=r)
    except AmbiguousId:
        raise
    except UnknownId:
        return given
