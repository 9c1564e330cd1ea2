"""On a worker: send a job again after its function raised an error its retry policy names (gpulayer/retries.py).

The next try is a new message with the job's id, arguments, headers and canvas fields, published to the
queue the job came from (any worker reading it may take it), with the backoff as its countdown; then
Celery's ``Retry`` is raised, so the try is stored as ``RETRY`` with its error, the ``task-retried`` event
goes to Flower, and the delivery is acked. Each try is also recorded in the job's history (``h.history()``:
``{"event": "retried", "attempt": 1, "error": "ConnectionError('x') on w-1", "delay": 0.5}``).

A delivery that dies with its worker is not a try: it goes back to its queue as every job's does
(engine/request.py, ``max_deliveries``), with its policy as it was.
"""

from __future__ import annotations

import logging

from celery.exceptions import Retry
from celery.utils.time import maybe_iso8601

from .. import retries
from ..app import SUBMIT, app
from ..engine import publish
from ..session import BROKER_ERRORS
from ..store.jobs import JobRecords
from ..procs import runtime

log = logging.getLogger(__name__)

HEADER_PREFIX = "gl_"  # gpulayer's headers (resources, timeout, sender, retry policy, ...): a retry keeps them all


def again(task, policy: dict, exc: Exception) -> None:
    """Send the job's next try and raise Celery's ``Retry``; return (the error stands) when ``policy`` does not
    retry ``exc``, or when the next try could not be sent."""
    if retries.applies(policy, exc):
        send_next(task, policy, exc)


def explicit(task, exc: BaseException | None, countdown: float | None, max_retries) -> Retry:
    """Celery's ``self.retry()`` (``celery.current_task.retry(exc=err, countdown=5)`` inside a job): the next try
    is sent (``countdown``, else the job's retry policy's delay, 0 by default) and ``Retry`` raised; past
    ``max_retries`` (the call's, else the job's policy's, else Celery's 3) ``exc`` is raised, or Celery's
    ``MaxRetriesExceededError``."""
    from celery.exceptions import MaxRetriesExceededError

    policy = task.request.get(retries.HEADER) or retries.for_explicit()
    if max_retries is not None:
        policy = {**policy, "max": max_retries}
    limit = policy["max"]
    if limit is not None and policy["count"] >= limit:
        if exc is not None:
            raise exc
        raise MaxRetriesExceededError(f"job {task.request.id} was retried {policy['count']} times, its max_retries")
    error = exc if exc is not None else RuntimeError("retry() called without an exception")
    send_next(task, policy, error, countdown)
    raise error  # the next try could not be sent (send_next logged why): this try's error is the job's


def send_next(task, policy: dict, exc: BaseException, countdown: float | None = None) -> None:
    """Publish the next try of the running job and raise ``Retry``; return when it could not be sent."""
    req = task.request
    worker = runtime.current_worker()
    worker_id = worker.id if worker else "?"
    outcome = retries.describe(exc, worker_id)
    following = retries.after_try(policy, outcome)
    tried = following["count"]
    if countdown is None:
        countdown = retries.delay(policy, tried)
    headers = {k: v for k, v in vars(req).items() if k.startswith(HEADER_PREFIX)}
    headers[retries.HEADER] = following
    delivery = req.delivery_info or {}
    queue = delivery.get("routing_key")
    limits = req.timelimit or (None, None)
    message = {"countdown": countdown or None, "retries": tried, "root_id": req.root_id, "parent_id": req.parent_id,
               "group_id": req.group, "group_index": req.group_index, "chord": req.chord, "chain": req.chain,
               "callbacks": req.callbacks, "errbacks": req.errbacks, "expires": maybe_iso8601(req.expires),
               "time_limit": limits[0], "soft_time_limit": limits[1], "origin": req.origin,
               "ignore_result": bool(req.ignore_result)}
    send = {"priority": delivery["priority"]} if delivery.get("priority") is not None else {}
    records = JobRecords(task.backend.client)
    try:  # recorded before the next try exists, so a client that has the job's result sees every try
        records.record(req.id, "retried", worker_id, attempt=tried, error=outcome, delay=round(countdown, 3))
    except BROKER_ERRORS as err:  # only the history misses this try
        log.warning("gpulayer: job %s try %d was not recorded in its history: %s", req.id, tried, err)
    try:
        with app.producer_or_acquire() as producer:
            publish.publish_task(app, producer, SUBMIT, req.id, tuple(req.args), dict(req.kwargs or {}), queue,
                                 headers, req.get("argsrepr") or "", req.get("kwargsrepr") or "",
                                 shadow=req.shadow, message_options=message, send_options=send)
    except BROKER_ERRORS as err:  # the next try was not sent: this one's error is the job's
        log.warning("gpulayer: job %s raised %s and was to be retried, but the retry could not be sent: %s",
                    req.id, outcome, err)
        try:
            records.record(req.id, "retry-not-sent", worker_id, attempt=tried, error=f"{type(err).__name__}: {err}")
        except BROKER_ERRORS:
            pass
        return
    log.info("gpulayer: job %s try %d raised %s; try %d in %.1f s", req.id, tried, outcome, tried + 1, countdown)
    raise Retry(f"try {tried} of {_limit(policy)} raised {outcome}; try {tried + 1} in {countdown:.1f} s", exc,
                countdown)


def _limit(policy: dict) -> str:
    return "unlimited" if policy["max"] is None else str(policy["max"] + 1)
