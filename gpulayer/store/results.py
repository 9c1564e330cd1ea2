"""A job's failure as the user sees it: one ``JobFailed`` carrying the remote type name, message,
traceback and the worker the job ran on.

The result backend (``engine/results.py``) turns every stored failure into one through
``as_job_failed``, so every path that reads a result (``AsyncResult.get``, group joins,
batch gathering) raises the same error type.
"""

from __future__ import annotations

from ..errors import JobFailed

_DIED = ("WorkerLostError",)
# How a stop of a running job is worded (engine/request.py for a revoke, worker/reaper.py for a cancel or a
# timeout); a revoke's reason without it is one of a job that never ran.
STOPPED_WHILE_RUNNING = "stopped while running"
# How the explanations below begin: a message that starts so was explained once already.
_EXPLAINED = ("the job's process died", "the job's worker died")


def process_died(detail: str, deliveries: int | None = None, limit: int | None = None) -> str:
    """The one explanation of a job whose process died (``WorkerLostError``), built in one place.

    ``detail``: what billiard saw ("Worker exited prematurely: exitcode 7"); ``deliveries``/``limit``:
    when the worker gave up delivering the job again.
    """
    detail = detail.strip().rstrip(".")
    if deliveries is not None:
        return (f"the job's process died on all {deliveries} deliveries (limit {limit}), so it was not delivered "
                f"again (last: {detail}): the job itself most likely crashes its process (segfault, os._exit, "
                "out of memory); the worker and its other jobs carry on")
    return (f"the job's process died ({detail}): it crashed, called os._exit, or was killed (e.g. for memory); "
            "the worker and its other jobs carry on")


def as_job_failed(exc: BaseException, traceback: str | None, job_id: str | None,
                  worker: str | None = None) -> JobFailed:
    if isinstance(exc, JobFailed):
        return exc
    type_name = type(exc).__name__
    message = str(exc) or repr(exc)
    if type_name == "UnpickleableExceptionWrapper":  # the job raised an exception pickle cannot carry
        type_name = getattr(exc, "exc_cls_name", type_name)
        message = getattr(exc, "text", None) or " ".join(map(str, getattr(exc, "exc_args", ()))) or message
    if type_name == "TaskRevokedError":
        type_name, message = "JobStopped", (f"job cancelled: {message}" if message.startswith(STOPPED_WHILE_RUNNING)
                                            else f"job cancelled before it ran ({message})")
    if type_name in _DIED and not message.startswith(_EXPLAINED):
        message = process_died(message)
    return JobFailed(type_name, message, traceback, job_id, worker)
