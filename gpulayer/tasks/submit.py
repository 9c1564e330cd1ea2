"""``submit``: the task that runs any callable on a worker that can run it."""

from __future__ import annotations

from celery import Task, signature
from celery.result import AsyncResult
from celery.exceptions import Ignore
from kombu.exceptions import EncodeError

from .. import app as app_mod
from .. import canvas
from ..app import RESOURCES_HEADER, SUBMIT, app
from ..connection import ensure_connected
from ..errors import PayloadError
from ..models import Resources
from ..payload import pack_function, resolve_function, summarize
from ..worker import runtime
from ..worker.reaper import TIMEOUT_HEADER


def as_resources(value) -> Resources:
    if value is None:
        return Resources()
    if isinstance(value, Resources):
        return value
    if isinstance(value, dict):
        return Resources(**value)
    raise TypeError(f"resources must be a gpulayer.Resources or a dict, got {type(value).__name__}")


class JobHandle(AsyncResult):
    """A submitted job: ``get()`` (the value, or ``JobFailed``), ``cancel()``, ``history()``."""

    def get(self, *args, **kwargs):
        """The job's value, or ``JobFailed``; Ctrl-C says the job still runs and how to stop it."""
        try:
            return super().get(*args, **kwargs)
        except KeyboardInterrupt:
            from ..cancel import interrupted

            raise interrupted([self.id], "handle.cancel()") from None  # not redis-py's frames: the job runs on

    def cancel(self) -> None:
        """Drop the job if it is still queued, or kill its whole process tree if it runs."""
        from ..cancel import cancel_jobs

        cancel_jobs([self.id], only_unfinished=False)

    def history(self) -> list[dict]:
        """Deliveries that died (``lost``) and reruns (``redelivered``), with their workers."""
        from .. import app as app_mod
        from ..store.jobs import JobRecords

        client = app_mod.redis_client()
        try:
            return JobRecords(client).history(self.id)
        finally:
            client.close()

    @property
    def attempts(self) -> int:
        """How many times the job was delivered so far (1 unless a delivery died)."""
        return 1 + sum(1 for h in self.history() if h["event"] == "lost")


class SubmitTask(Task):
    """Packs the function, routes by ``resources=``, and returns a handle whose errors are ``JobFailed``.

    Signatures compose as Celery's do: ``submit.s(fn, 1)`` keeps ``fn`` apart from
    its positional args (gpulayer/canvas.py), so a chain, a link or a chord body
    calls ``fn(previous_result, 1)`` and ``submit.s(fn).delay(1)`` calls ``fn(1)``.
    """

    typing = False
    Request = "gpulayer.engine.request:JobRequest"

    def AsyncResult(self, task_id, **kwargs):
        return JobHandle(task_id, backend=self.backend, task_name=self.name, app=self._get_app(), **kwargs)

    def signature(self, args=None, *starargs, **starkwargs):
        """``submit.s(fn, *args, resources=...)``: a signature whose function travels beside its args."""
        starkwargs.setdefault("app", self.app)
        return canvas.take_function(signature(self, args, *starargs, **starkwargs))

    subtask = signature

    def map(self, fn, items, resources=None):
        """One job that returns ``[fn(x) for x in items]``, as Celery's ``task.map(items)``."""
        return canvas.map_signature(self, fn, items, star=False, resources=resources)

    def starmap(self, fn, items, resources=None):
        """One job that returns ``[fn(*x) for x in items]``, as Celery's ``task.starmap(items)``."""
        return canvas.map_signature(self, fn, items, star=True, resources=resources)

    def chunks(self, fn, items, n, resources=None):
        """Starmap jobs of ``n`` items each; ``.apply_async().get()`` is a list of lists; ``.group()`` too."""
        return canvas.chunks(self, fn, items, n, resources=resources)

    def apply(self, *args, **kwargs):
        raise PayloadError("submit runs jobs on workers, not in this process: sig.apply() (eager) is not "
                           "supported; use sig.delay(...) or sig.apply_async(...), then .get()")

    def apply_async(self, args=None, kwargs=None, task_id=None, producer=None, link=None, link_error=None,
                    shadow=None, **options):
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        if canvas.FUNCTION_OPTION in options:  # from a signature: args are all the function's
            fn = options.pop(canvas.FUNCTION_OPTION)
        elif args:  # submit.delay(fn, *args) / submit.apply_async((fn, *args))
            fn, args = args[0], args[1:]
        else:
            raise PayloadError("submit needs the function to run as its first argument: submit.delay(fn, *args)")
        resources = as_resources(kwargs.pop("resources", None))
        timeout = kwargs.pop("timeout", None)
        ref = pack_function(fn)
        headers = dict(options.pop("headers", None) or {})
        headers[RESOURCES_HEADER] = resources.model_dump(exclude_defaults=True)
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
            headers[TIMEOUT_HEADER] = float(timeout)
        options.setdefault("argsrepr", summarize(fn, args, kwargs))
        options.setdefault("kwargsrepr", resources.describe())
        ensure_connected()
        # A later step no live worker can run is refused now, not by the worker that would send it.
        for later in canvas.later_signatures(options.get("chain"), options.get("chord"), link, link_error):
            app_mod.route_for(as_resources(later.kwargs.get("resources")))
        try:
            return super().apply_async((ref, *args), kwargs, task_id=task_id, producer=producer, link=link,
                                       link_error=link_error, shadow=shadow, headers=headers, **options)
        except EncodeError as err:
            cause = err.__cause__ or err.__context__ or err
            raise (cause if isinstance(cause, PayloadError) else PayloadError(str(err))) from err


def _already_done(task) -> bool:
    """Was this job's final result stored by an earlier delivery? Record the redelivery either way."""
    from ..store import keys
    from ..store.jobs import JobRecords

    client = task.backend.client
    worker = runtime.current_worker()
    JobRecords(client).record(task.request.id, "redelivered", worker.id if worker else "?")
    return bool(client.exists(keys.job_done(task.request.id)))


@app.task(bind=True, base=SubmitTask, name=SUBMIT)
def submit(self, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` on a worker (the message is ``(fn, *args)``); see ``gpulayer.submit``."""
    fn, *args = args  # not a named parameter: a job's own keyword argument may be called fn
    if (self.request.delivery_info or {}).get("redelivered") and _already_done(self):
        raise Ignore()  # a rerun of a job whose result is stored: never run twice, never overwrite
    func = fn if callable(fn) else resolve_function(fn)
    spec = self.request.get(RESOURCES_HEADER) or {}
    with runtime.job_scope(self.request.id, int(spec.get("gpus", 0))):
        return func(*args, **kwargs)
