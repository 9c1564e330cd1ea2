"""``submit``: the task that runs any callable on a worker that can run it."""

from __future__ import annotations


from celery import Task, signature
from celery.result import AsyncResult
from celery.exceptions import Ignore
from kombu.exceptions import DecodeError, EncodeError
from kombu.utils.uuid import uuid

from .. import app as app_mod
from .. import canvas, remote_errors, retries
from ..app import CLIENT_HEADER, RESOURCES_HEADER, SUBMIT, TIMEOUT_HEADER, app
from ..session import BROKER_ERRORS, broker_lost, ensure_connected, outage
from ..deadline import Deadline
from ..engine import publish
from . import options as job_options
from . import readahead
from . import refs
from ..errors import InvalidRequest, PayloadError, UnsupportedOption
from ..models import Resources
from ..payload import job_name, pack_function, resolve_function, summarize
from ..output import capture, watch
from ..procs import runtime
from ..workspace import cache as code_cache
from ..workspace import shipping
from ..workspace.shipping import CODE_HEADER

OUTPUT_HEADER = "gl_out"  # the sender's output id (gpulayer/output/watch.py): where the job's lines go


def as_resources(value) -> Resources:
    if value is None:
        return Resources()
    if isinstance(value, Resources):
        return value
    if isinstance(value, dict):
        return Resources(**value)
    raise TypeError(f"resources must be a gpulayer.Resources or a dict, got {type(value).__name__}")


class SubmitTask(Task):
    """Packs the function, routes by ``resources=``, and returns a handle whose errors are ``JobFailed``.

    Signatures compose as Celery's do: ``submit.s(fn, 1)`` keeps ``fn`` apart from
    its positional args (gpulayer/canvas.py), so a chain, a link or a chord body
    calls ``fn(previous_result, 1)`` and ``submit.s(fn).delay(1)`` calls ``fn(1)``.
    """

    typing = False
    Request = "gpulayer.engine.request:JobRequest"
    # The class of the handles it returns: the client API's JobHandle (gpulayer/job_handle.py), installed there
    # when the client layer loads (``gpulayer.submit`` loads it), as the worker hands the engine its pieces.
    handle_class: type[AsyncResult] = AsyncResult

    def AsyncResult(self, task_id, **kwargs):
        return self.handle_class(task_id, backend=self.backend, task_name=self.name, app=self.app, **kwargs)

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

    def retry(self, args=None, kwargs=None, exc=None, throw=True, eta=None, countdown=None, max_retries=None,
              **options):
        """Celery's ``self.retry()``, for a job's function: ``celery.current_task.retry(exc=err, countdown=5)``
        sends the job again (through its queue, as an ``autoretry_for`` retry: tasks/retry.py) and raises
        Celery's ``Retry``; past ``max_retries`` it raises ``exc``. Other arguments, an ``eta`` or
        ``throw=False`` are refused."""
        import sys

        if args is not None or kwargs is not None or eta is not None or not throw or options:
            raise UnsupportedOption(
                "retry() of a gpulayer job takes exc=, countdown= and max_retries=: the job runs again with its "
                "own arguments, and throw=False, eta= and other options are not honoured")
        from .retry import explicit

        return explicit(self, exc if exc is not None else sys.exc_info()[1], countdown, max_retries)

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        """The job reached its final state (Celery skips this for a try that is sent again): the objects its
        arguments held are released (``tasks/refs.py``)."""
        refs.job_ended(task_id, _results_client)

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
        retry = code_options = None
        if options:  # (the usual delay has none: nothing to check)
            code_options = {k: options.pop(k) for k in shipping.OPTIONS if k in options}  # gpulayer/workspace/
            retry = retries.take(options)  # max_retries, autoretry_for, retry_backoff, ... (gpulayer/retries.py)
            job_options.check(options)  # any option not honoured is refused, not dropped
        headers = dict(options.pop("headers", None) or {})
        headers[RESOURCES_HEADER] = resources.model_dump(exclude_defaults=True)
        if retry is not None:
            headers[retries.HEADER] = retry
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise InvalidRequest(f"submit(timeout={timeout!r}): timeout must be a positive number of seconds")
            headers[TIMEOUT_HEADER] = float(timeout)
        ensure_connected()
        sender, out = _origin(self.app)
        headers.setdefault(CLIENT_HEADER, sender)  # the transport records it (engine/senders.py)
        if out is not None:
            headers.setdefault(OUTPUT_HEADER, out)
        code = shipping.digest_for(_results_client, code_options)  # the user's modules (gpulayer/workspace/)
        if code is not None:
            headers[CODE_HEADER] = code
        later = (options.get("chain"), options.get("chord"), link, link_error) if options or link or link_error \
            else None  # the steps its message carries, whose arguments travel in it too
        if not refs.plain_call(args, kwargs) or (later and any(later)):  # (a tiny job: a type check per argument)
            task_id = task_id or uuid()
            try:  # large values to the object store, refs held for the job: before anything is sent
                args, kwargs = refs.for_job(args, kwargs, task_id, _results_client())
                refs.for_later(later, _results_client())
            except BROKER_ERRORS as err:
                raise broker_lost(err, f"job {task_id} was not sent") from err
        if not options and producer is None and link is None and link_error is None and shadow is None \
                and direct_publish_applies(self.app):
            job_id = task_id or uuid()
            # A broker restarting (the embedded Redis after a crash) is back within connect_timeout; a Sentinel
            # group within a failover (sent again with the same id: a job published twice runs once).
            lost = outage(Deadline(app_mod.publish_patience()), f"job {job_id} was not sent")
            while True:
                try:
                    queue = app_mod.route_for(resources).queue
                    with self.app.producer_or_acquire() as producer:
                        send_job(producer, job_id, ref, args, kwargs, queue, headers, summarize(fn, args, kwargs),
                                 resources.describe())
                    readahead.sent(self.backend, job_id)
                    handle = self.AsyncResult(job_id)
                    handle.sent_to = queue  # the queue it waits in: a timeout's message counts the jobs there
                    return handle
                except BROKER_ERRORS as err:
                    lost.lost(err)
        options.setdefault("argsrepr", summarize(fn, args, kwargs))
        options.setdefault("kwargsrepr", resources.describe())
        try:
            # A later step no live worker can run is refused now, not by the worker that would send it.
            for later in canvas.later_signatures(options.get("chain"), options.get("chord"), link, link_error):
                app_mod.route_for(as_resources(later.kwargs.get("resources")))
            return super().apply_async((ref, *args), kwargs, task_id=task_id, producer=producer, link=link,
                                       link_error=link_error, shadow=shadow or _shown_name(ref, kwargs),
                                       headers=headers, **options)
        except EncodeError as err:
            raise payload_error(err) from err
        except BROKER_ERRORS as err:
            raise broker_lost(err, "the job was not sent") from err


def _shown_name(ref, kwargs: dict) -> str:
    """The job's name in logs, events and Flower: its function's (``submit.map``'s: ``map:fn``)."""
    if ref in (canvas.MAP, canvas.STARMAP) and "func" in kwargs:
        return f"{'starmap' if ref == canvas.STARMAP else 'map'}:{job_name(kwargs['func'])}"
    return job_name(ref)


def _origin(celery_app) -> tuple[str, str | None]:
    """Who sends, and where the job's output lines go: this client's identity and output id (``log_to_client``;
    its subscriber started on the first job), or inside a job (a chain's next step, a job's own jobs) those of
    the client that sent that job, so `gpulayer cancel --all-mine` finds the whole of what a client started and
    its jobs' jobs print where it runs."""
    task = celery_app.current_worker_task
    if task is not None:
        request = task.request
        return request.get(CLIENT_HEADER) or app_mod.client_identity(), request.get(OUTPUT_HEADER)
    return app_mod.client_identity(), watch.output_id()


def output_header(celery_app) -> str | None:
    """Where a job's output lines go (``_origin``); None with ``log_to_client`` off."""
    return _origin(celery_app)[1]


def direct_publish_applies(celery_app) -> bool:
    """May a job be published by ``send_job`` instead of Celery's ``send_task``? Only where the two send the
    same message: not eagerly, with gpulayer's router alone, and not from inside a job (whose children Celery
    links to it by parent and root id)."""
    conf = celery_app.conf
    return conf.task_routes == app_mod.ROUTES and not conf.task_always_eager and celery_app.current_worker_task is None


def send_job(producer, job_id: str, ref, args: tuple, kwargs: dict, queue: str, headers: dict, argsrepr: str,
             kwargsrepr: str) -> None:
    """Publish one ``submit`` job routed to ``queue`` already (``engine/publish.py``: the message Celery's
    ``send_task`` would build, in one script call where it may)."""
    sender = headers.get(CLIENT_HEADER)
    channel = publish.direct(app, producer, queue, headers) if sender else None
    if channel is None:
        try:
            publish.publish_task(app, producer, SUBMIT, job_id, (ref, *args), kwargs, queue, headers, argsrepr,
                                 kwargsrepr, shadow=_shown_name(ref, kwargs))
        except EncodeError as err:
            raise payload_error(err) from err
        return
    raw = build_job(channel, job_id, ref, args, kwargs, queue, headers, argsrepr, kwargsrepr)
    publish.publish_one(channel, queue, raw, job_id, sender)


def build_job(channel, job_id: str, ref, args: tuple, kwargs: dict, queue: str, headers: dict, argsrepr: str,
              kwargsrepr: str) -> str:
    """The message of one ``submit`` job, as ``send_job`` would send it, for ``publish.publish_one`` or
    ``publish.publish_chunk`` on ``channel`` (``publish.direct``)."""
    try:
        return publish.build(app, channel, SUBMIT, job_id, (ref, *args), kwargs, queue, headers, argsrepr,
                             kwargsrepr, shadow=_shown_name(ref, kwargs))
    except EncodeError as err:
        raise payload_error(err) from err


def payload_error(err: EncodeError) -> PayloadError:
    """kombu's ``EncodeError`` as the ``PayloadError`` the signed serializer raised inside it (or one saying it)."""
    cause = err.__cause__ or err.__context__ or err
    return cause if isinstance(cause, PayloadError) else PayloadError(str(err))


def _already_done(task) -> bool:
    """Was this job's final result stored by an earlier delivery? Record the redelivery either way."""
    from ..store import keys
    from ..store.jobs import JobRecords

    client = task.backend.client
    worker = runtime.current_worker()
    JobRecords(client).record(task.request.id, "redelivered", worker.id if worker else "?")
    return bool(client.exists(keys.job_done(task.request.id)))


def _results_client():
    return app.backend.client


def with_shipped_code(request: dict, run, *args, **kwargs):
    """In a pool process: ``run(*args, **kwargs)`` (the job's trace) with the job's shipped code first on
    ``sys.path``, made ready before its body is decoded; a module the body's objects need and the worker lacks
    fails as the job's own call would (``explain``), not as kombu's bare ``DecodeError``.

    An error making the code ready (its archive expired) is left to the job's own call, which raises it.
    """
    code = request.get(CODE_HEADER)
    try:
        code_cache.enter(code, _results_client)
    except Exception:
        pass
    try:
        return run(*args, **kwargs)
    except DecodeError as err:
        missing = err.__cause__ or err.__context__
        if not isinstance(missing, ModuleNotFoundError):
            raise
        worker = runtime.current_worker()
        raise code_cache.explain(missing, code, worker.id if worker else None) from None


@app.task(bind=True, base=SubmitTask, name=SUBMIT)
def submit(self, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` on a worker (the message is ``(fn, *args)``); see ``gpulayer.submit``."""
    fn, *args = args  # not a named parameter: a job's own keyword argument may be called fn
    if (self.request.delivery_info or {}).get("redelivered") and _already_done(self):
        raise Ignore()  # a rerun of a job whose result is stored: never run twice, never overwrite
    code = self.request.get(CODE_HEADER)
    code_cache.enter(code, _results_client)  # done before the decode already, unless that failed
    spec = self.request.get(RESOURCES_HEADER) or {}
    request = self.request
    worker = runtime.current_worker()
    with runtime.job_scope(request.id, int(spec.get("gpus", 0))), \
            capture.job(request.id, fn, worker.id if worker else "?", request.get(OUTPUT_HEADER)):
        try:
            func = fn if callable(fn) else resolve_function(fn)
            if not refs.plain_call(args, kwargs):  # refs to values, read here in the pool process
                args, kwargs = refs.resolve(args, kwargs, request.id)
            # a large result goes to the object store, kept as long as the result is: its ref is what is stored
            return refs.for_result(func(*args, **kwargs), request.id, _results_client, _expires)
        except BaseException as exc:  # (a try block costs nothing while nothing raises: no per-job work here)
            if isinstance(exc, ModuleNotFoundError) and not code_cache.explained(exc):  # name module, worker, fix
                told = code_cache.explain(exc, code, worker.id if worker else None).with_traceback(exc.__traceback__)
                remote_errors.capture(request.id, told)
                raise told from None
            if isinstance(exc, Exception):
                policy = request.get(retries.HEADER)
                if policy is not None:  # max_retries / autoretry_for: maybe send it again (tasks/retry.py)
                    from .retry import again

                    again(self, policy, exc)  # raises Celery's Retry once the next try is sent
            # packed as raised, before Celery replaces what plain pickle cannot carry
            remote_errors.capture(request.id, exc)
            raise


def _backend_client():
    return app.backend.client


def _expires() -> int:
    """Seconds a job's output tail is kept: as long as its result."""
    expires = getattr(app.backend, "expires", None)
    return int(expires.total_seconds() if hasattr(expires, "total_seconds") else expires or 86400)


capture.use(_backend_client, _expires)
