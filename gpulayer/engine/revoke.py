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

Patched in by :func:`install` (the worker, before it starts); pinned in ``engine/upstream.py``.
"""

from __future__ import annotations

from celery.worker import control, state as worker_state

from .upstream import patch

_original = control._revoke


def _revoke(state, task_ids, terminate=False, signal=None, **kwargs):
    """Celery's command, but with ``terminate`` only for the ids this worker holds (see the docstring)."""
    if not terminate:
        return _original(state, task_ids, terminate, signal, **kwargs)
    task_ids = set(task_ids)
    worker_state.revoked.update(task_ids)
    held = {request.id for request in control._find_requests_by_id(task_ids)}
    if not held:
        return control.ok("terminate: tasks unknown")
    return _original(state, held, terminate, signal, **kwargs)


def install() -> None:
    patch(control, "celery.worker.control:_revoke", _revoke)
