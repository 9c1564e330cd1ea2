"""``gpulayer cancel``: stop jobs, distributed jobs and batches from a shell, whoever sent them.

An id is a whole id or any unique prefix of at least 6 characters (``gpulayer/ids.py``; an ambiguous one
names what it matches). It is looked up as a distributed job (``gl:gang:<id>``), then as a ``submit_batch`` or Celery group
(``gl:batch:<id>``), then as a job (its stored result, or a sender's record: ``store/sent.py``). Jobs stop
as ``batch.cancel()`` stops them (``cancel.cancel_jobs``), distributed jobs as ``job.cancel()`` does
(``distributed_job.cancel_gang``). ``--all-mine`` stops what this client identity (the token's user, else config ``client_id``,
default ``user@host``) sent in the last day. On a cluster with users, a user's cancel of another user's job is
refused (said here from the senders' records; decided by the workers, users/permits.py). One line per id; the exit status is 1 when an id is unknown
or a distributed job's ranks did not all report stopped, else 0 (an id that had finished already is fine).
"""

from __future__ import annotations

import sys

from celery import states

from ..errors import AmbiguousId, UnknownId
from ..ids import MIN_PREFIX, resolve
from .cluster import connected_client

GANG_WAIT = 30.0  # seconds to wait for every node of a cancelled distributed job to report its ranks stopped


def cancel(ids: list[str], all_mine: bool = False, out=None, err=None) -> int:
    """The ``gpulayer cancel`` command; returns its exit status."""
    from .. import app as app_mod

    out, err = out or sys.stdout, err or sys.stderr
    r = connected_client("cancel on")
    code = 0
    if all_mine:
        print(_all_mine(r, app_mod.client_identity()), file=out)
    for given in ids:
        try:
            job_id = resolve(given, r=r)  # a whole id, or a unique prefix of at least 6 characters
        except AmbiguousId as ambiguous:
            print(f"gpulayer cancel: {ambiguous}", file=err)
            code = 1
            continue
        except UnknownId:
            job_id = given  # said below, as for any id nothing was sent with
        line, ok = _one(r, job_id)
        print(line if ok else f"gpulayer cancel: {line}", file=out if ok else err)
        code = code if ok else 1
    return code


def gang_line(rec: dict) -> tuple[str, bool]:
    """One line for a cancelled (or already ended) distributed job, and whether nothing is left running."""
    spec = rec.get("spec") or {}
    shape = f"{spec.get('nodes', '?')} x {spec.get('procs_per_node', '?')} job {rec['gang_id']}"
    if not rec["cancelled"]:
        return f"distributed {shape}: already {rec['state']}", True
    if not rec.get("placement"):
        return f"cancelled {shape} while it waited for slots; nothing had started", True
    if rec["left"]:
        return (f"cancelled {shape}, but {rec['left']} node(s) did not report their ranks stopped within "
                f"{GANG_WAIT:.0f}s (workers: {', '.join(rec['placement']['workers'])}); see `gpulayer status`"), False
    return f"cancelled {shape}; nothing left running", True


def _one(r, job_id: str) -> tuple[str, bool]:
    from ..distributed_job import cancel_gang
    from ..store.sent import batch_members

    gang = cancel_gang(job_id, GANG_WAIT)
    if gang is not None:
        return gang_line(gang)
    members = batch_members(r, job_id)
    if members:
        return f"batch {job_id}: {_stop_jobs(members)[0]}", True
    return _job(r, job_id)


def _job(r, job_id: str) -> tuple[str, bool]:
    from .. import app as app_mod
    from ..cancel import cancel_jobs, held_by_workers
    from ..store.sent import was_sent

    state = app_mod.app.backend.get_task_meta(job_id)["status"]
    if state in states.READY_STATES:
        return f"job {job_id}: already finished ({state})", True
    worker = held_by_workers([job_id]).get(job_id)
    if state == states.PENDING and worker is None and not was_sent(r, job_id):
        short = f"; a short id needs at least {MIN_PREFIX} characters" if len(job_id) < MIN_PREFIX else ""
        return (f"unknown id {job_id}: no job, distributed job or batch with this id was sent in the last day "
                f"(check the id; a finished job's result expires after result_expires{short})"), False
    refused = _not_mine(r, job_id)
    if refused:
        return refused, False
    cancel_jobs([job_id], only_unfinished=False)
    return f"job {job_id}: cancelled ({f'on worker {worker}' if worker else 'queued'})", True


def _not_mine(r, job_id: str) -> str | None:
    """Why this user's cancel of ``job_id`` will be refused (another user sent it), else None. Workers decide
    (users/permits.py); this only says so before asking them."""
    import json

    from .. import signing
    from ..store import keys
    from ..store.sent import senders_of

    me = signing.current_user()
    if me is None:
        return None  # the cluster secret's holder, or a cluster without users
    senders = senders_of(r, job_id)
    if not senders or me in senders:
        return None
    raw = r.hget(keys.USERS, me)
    if raw and json.loads(raw).get("admin"):  # (unverified here; the workers check the entry's MAC)
        return None
    return (f"job {job_id}: refused: it was sent by {', '.join(senders)}, and user {me} may cancel only its own "
            "jobs (an admin may cancel any)")


def _stop_jobs(ids: list[str]) -> tuple[str, list[str]]:
    """Cancel the unfinished of ``ids``: how many were queued, on workers (running, or taken ahead of a free
    slot) and finished, and the unfinished."""
    from ..cancel import cancel_jobs, held_by_workers, unfinished

    left = unfinished(ids)
    running = len(held_by_workers(left))
    cancel_jobs(left, only_unfinished=False)
    return (f"cancelled {len(left) - running} queued, {running} on workers ({len(ids) - len(left)} of {len(ids)} "
            "had finished)"), left


def _all_mine(r, identity: str) -> str:
    """Stop every job and distributed job ``identity`` sent that has not finished."""
    from ..distributed_job import cancel_gang
    from ..store.gangs import GangStore
    from ..store.sent import forget, sent_by

    sent = sent_by(r, identity)
    jobs, left = _stop_jobs(sent)
    left = set(left)
    forget(r, identity, [i for i in sent if i not in left])  # finished: not read again next time
    gangs = [rec["gang_id"] for rec in GangStore(r).active() if (rec.get("spec") or {}).get("client") == identity]
    lines = [gang_line(rec)[0] for rec in (cancel_gang(g, GANG_WAIT) for g in gangs) if rec is not None]
    return f"all of {identity}'s jobs: {jobs}" + "".join(f"\n{line}" for line in lines) + \
        ("" if lines else "; no distributed job")
