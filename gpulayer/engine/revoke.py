"""A ``revoke(terminate=True)`` of a running job is told by the worker that runs it, not by the others.

Celery broadcasts a revoke to every worker. Its command (``celery.worker.control._revoke``) stores
"revoked" in the result backend on each worker that does not hold the job as active, whenever the job's
stored state is still PENDING; gpulayer stores no STARTED state (one write less per job), so every
worker but the one running it wrote "revoked" at once, racing the owner's "stopped while running
(after 3.2 s)" (``engine/request.py``), and the client often read the first: a job that ran for
seconds said ``job cancelled before it ran (revoked)`` (issue 28).

With ``terminate``, a worker that holds no request for an id now only adds it to its revoked set
(so it drops the job on sight, as before) and stores nothing: the worker that holds it says what
happened (stopped while running, or before it ran), and a job still in a queue says "revoked" when a
worker takes it. A plain revoke (no ``terminate``) is Celery's as it was.

On a cluster with users, a revoke signed by a user who is not an admin stops only that user's jobs: the
worker is handed the rule (``refusal``, users/permits.py) at install time. Held jobs are checked at once; a
queued job's revoke is kept with its signer (:data:`by_user`) and applied as the job is taken, when its owner
is known (engine/request.py calls :func:`on_taken`).

Patched in by :func:`install` (the worker, before it starts); pinned in ``engine/upstream.py``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from celery.worker import control, state as worker_state

from .. import signing
from .senders import owner_of
from .upstream import patch

log = logging.getLogger(__name__)
_original = control._revoke
_refusal = None  # (signer, owner, job id) -> why not, or None: handed in by install()
by_user: "OrderedDict[str, str]" = OrderedDict()  # queued job id -> the user who revoked it (not an admin)
_KEEP = 50_000  # user revokes kept for jobs not taken yet


def _by_owner(task_ids) -> set:
    """The ids of ``task_ids`` this revoke's signer may stop now; a user's revokes of jobs not held here are
    kept for :func:`on_taken`."""
    signer = signing.last_signer()
    if _refusal is None or _refusal(signer, None, "") is None:
        return set(task_ids)  # no users, the cluster's own revoke, or an admin's: as Celery does
    held = {request.id: owner_of(request) for request in control._find_requests_by_id(set(task_ids))}
    allowed = set()
    for job_id in task_ids:
        if job_id not in held:
            by_user[job_id] = signer
            while len(by_user) > _KEEP:
                by_user.popitem(last=False)
            continue
        why = _refusal(signer, held[job_id], job_id)
        if why:
            log.warning("gpulayer: %s", why)
        else:
            allowed.add(job_id)
    return allowed


def on_taken(request) -> None:
    """A job just taken: a user's revoke kept for it counts if that user may stop it (then Celery drops it)."""
    signer = by_user.pop(request.id, None) if by_user else None
    if signer is None:
        return
    why = _refusal(signer, owner_of(request), request.id)
    if why:
        log.warning("gpulayer: %s", why)
    else:
        worker_state.revoked.add(request.id)


def _revoke(state, task_ids, terminate=False, signal=None, **kwargs):
    """Celery's command, but with ``terminate`` only for the ids this worker holds, and on a cluster with
    users only for the jobs the revoke's signer may stop (see the docstring)."""
    task_ids = _by_owner(task_ids)
    if not task_ids:
        return control.ok("revoke: no job this user may stop is here yet")
    if not terminate:
        return _original(state, task_ids, terminate, signal, **kwargs)
    task_ids = set(task_ids)
    worker_state.revoked.update(task_ids)
    held = {request.id for request in control._find_requests_by_id(task_ids)}
    if not held:
        return control.ok("terminate: tasks unknown")
    return _original(state, held, terminate, signal, **kwargs)


def install(refusal=None) -> None:
    """``refusal(signer, owner, job_id)``: why the revoke's signer may not stop the job, or None."""
    global _refusal
    _refusal = refusal
    patch(control, "celery.worker.control:_revoke", _revoke)
