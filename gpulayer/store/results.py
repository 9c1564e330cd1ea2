"""A job's failure as the user sees it: one ``JobFailed`` carrying the remote type name, message,
traceback and the worker the job ran on.

The result backend (``engine/results.py``) turns every stored failure into one through
``as_job_failed``, so every path that reads a result (``AsyncResult.get``, group joins,
batch gathering) raises the same error type.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import JobFailed, JobStopped
from ..remote_errors import ENGINE_PACKAGES, RECORD_KEY, failure, typed

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
    """``exc`` (a stored failure as Celery rebuilt it, or a failure seen in this process) as the user's error."""
    if isinstance(exc, JobFailed):
        return exc
    type_name, message, engine_type = _named(exc)
    engine = type(exc).__module__.partition(".")[0] in ENGINE_PACKAGES
    remote_type = engine_type if engine_type is not None or type_name in _DIED or engine else type(exc)
    return typed(JobFailed, remote_type, type_name, message, traceback, job_id, worker, remote=exc)


def _named(exc: BaseException) -> tuple[str, str, type | None]:
    """The type name and message the user sees for ``exc``, and the class the error is typed as (or None)."""
    type_name = type(exc).__name__
    message = str(exc) or repr(exc)
    remote_type: type | None = None  # Celery's classes and the wrapper below: not the job's own
    if type_name == "UnpickleableExceptionWrapper":  # the job raised an exception pickle cannot carry
        type_name = getattr(exc, "exc_cls_name", type_name)
        message = getattr(exc, "text", None) or " ".join(map(str, getattr(exc, "exc_args", ()))) or message
    if type_name == "TaskRevokedError":
        type_name, message = "JobStopped", (f"job cancelled: {message}" if message.startswith(STOPPED_WHILE_RUNNING)
                                            else f"job cancelled before it ran ({message})")
        remote_type = JobStopped
    if type_name in _DIED and not message.startswith(_EXPLAINED):
        message = process_died(message)
    return type_name, message, remote_type


def from_record(record: dict, traceback: str | None, job_id: str | None, worker: str | None,
                to_python: Callable[[dict], BaseException]) -> JobFailed:
    """A stored failure (Celery's exception record, with the worker's pack of the exception beside it,
    ``remote_errors.RECORD_KEY``) as the user's error: typed as the job's own exception where it can be."""
    packed = record.get(RECORD_KEY)
    celery_record = {k: v for k, v in record.items() if k != RECORD_KEY}
    try:
        exc = to_python(celery_record)
    except Exception as err:  # a record Celery refuses (its SecurityError): say what it was
        exc = Exception(f"{celery_record.get('exc_type')}: {celery_record.get('exc_message')} ({err})")
    if isinstance(exc, JobFailed):
        return exc
    type_name, message, engine_type = _named(exc)
    if engine_type is not None or type_name in _DIED:  # the engine's own failures: a cancel, a process died
        return typed(JobFailed, engine_type, type_name, message, traceback, job_id, worker)
    if isinstance(packed, dict):
        qualname = packed.get("qualname") or type_name
        if celery_record.get("exc_type") == "UnpickleableExceptionWrapper" and packed.get("traceback"):
            traceback = packed["traceback"]  # Celery's ends with its wrapper's name, this one with the job's class
        return failure(JobFailed, qualname.rpartition(".")[2], packed.get("message") or message, traceback, job_id,
                       worker, packed, module=packed.get("module"), qualname=qualname)
    module, qualname, args = _class_of(celery_record)
    return failure(JobFailed, type_name, message, traceback, job_id, worker, None, args, module=module,
                   qualname=qualname)


def _class_of(record: dict) -> tuple[str | None, str | None, tuple | None]:
    """The module, qualified name and args of the exception Celery's record stands for."""
    args = record.get("exc_message")
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,) if args is not None else None
    if record.get("exc_type") == "UnpickleableExceptionWrapper" and args and len(args) >= 3:
        inner = args[2]
        return args[0], args[1], tuple(inner) if isinstance(inner, (list, tuple)) else None
    return record.get("exc_module"), record.get("exc_type"), args
