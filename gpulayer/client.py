"""The client API: connect to a cluster, send jobs, gather results."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

import redis
from celery import states
from celery.canvas import Signature
from kombu.exceptions import EncodeError
from kombu.utils.uuid import uuid

from . import app as app_mod
from .cancel import cancel_jobs, interrupted
from .canvas import function_and_args
from .config import Settings, load_settings
from .errors import ClusterUnavailable, ConfigError, PayloadError
from .models import Resources
from .payload import PickledFunction, pack_function, summarize
from .store.connection import connect_redis
from .tasks.submit import as_resources, submit

_init_lock = threading.RLock()
_local = None  # the process-scoped embedded cluster init() started, if any


def connect(settings: Settings) -> Settings:
    """Point this process at the cluster ``settings`` names; fail fast if Redis is unreachable."""
    client = connect_redis(settings.broker_url, socket_connect_timeout=settings.connect_timeout,
                           socket_timeout=settings.connect_timeout)
    where = urlparse(settings.broker_url)
    try:
        client.ping()
    except redis.AuthenticationError as err:
        if not where.password:
            raise ClusterUnavailable(f"Redis at {where.hostname}:{where.port} needs a password: put it in the "
                                     "broker URL, redis://:PASSWORD@host:port/0") from err
        raise ClusterUnavailable(f"Redis at {where.hostname}:{where.port} refused the password in the broker URL: "
                                 f"{err}; check GPULAYER_BROKER_URL") from err
    except redis.ResponseError as err:
        if "NOAUTH" in str(err) or "AUTH" in str(err):
            raise ClusterUnavailable(f"Redis at {where.hostname}:{where.port} needs a password: put it in the "
                                     "broker URL, redis://:PASSWORD@host:port/0") from err
        raise
    except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
        raise ClusterUnavailable(f"cannot reach Redis at {where.hostname}:{where.port} within "
                                 f"{settings.connect_timeout:.0f}s ({err}); is it running, and is the "
                                 "broker URL right?") from err
    finally:
        client.close()
    if not settings.secret:
        raise ConfigError("no cluster secret: set GPULAYER_SECRET to the secret the workers use "
                          "(`gpulayer up` writes one to its state file)")
    app_mod.configure(settings)
    return settings


def init(broker_url: str | None = None, *, secret: str | None = None, workers: int | None = None,
         slots: int | None = None) -> Settings:
    """Connect to a cluster, starting an embedded one if none is configured.

    In order: ``broker_url`` / ``GPULAYER_BROKER_URL`` / the config file; else a
    running ``gpulayer up`` cluster; else a new embedded cluster (Redis and
    ``workers`` local workers) that lives as long as this process.
    """
    global _local
    with _init_lock:
        settings = load_settings(broker_url=broker_url, secret=secret)
        if settings.broker_url and not settings.broker_from_state:
            return connect(settings)
        if settings.broker_from_state:
            try:
                return connect(settings)
            except ClusterUnavailable:
                pass  # a stale state file: the `gpulayer up` cluster is gone
        if _local is None:
            from .local import start_for_process

            _local = start_for_process(workers=workers, slots=slots)
        return connect(load_settings(broker_url=_local.broker_url, secret=_local.secret))


def ensure_connected() -> None:
    if not app_mod.is_configured():
        init()


class BatchHandle:
    """The jobs of one ``submit_batch``: ``get()`` returns their results in submission order, ``cancel()``
    stops the ones not finished."""

    def __init__(self, ids: list[str]):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.02,
            progress: bool | None = None) -> list[Any]:
        """Results in submission order; the first failure raises ``JobFailed`` (or is returned if not ``propagate``).

        ``progress``: draw a bar (done, failed, rate, ETA); by default only for more than 8 jobs
        and only when stdout is a terminal.
        """
        try:
            from .progress import batch_progress

            with batch_progress(len(self.ids), progress) as tick:
                metas = self._gather(timeout, interval, tick)
        except KeyboardInterrupt:
            raise interrupted(self.ids, "batch.cancel()") from None  # the jobs run on without us
        out = []
        for meta in metas:
            if meta["status"] != states.SUCCESS and propagate:
                raise meta["result"]
            out.append(meta["result"])
        return out

    def cancel(self) -> int:
        """Stop every job of the batch that has not finished; returns how many were stopped.

        Queued jobs are dropped, running ones killed with their whole process tree, as
        ``handle.cancel()`` does, in one revoke broadcast and one pipelined publish for the batch.
        Their results become ``JobFailed`` (``JobStopped``: cancelled).
        """
        return cancel_jobs(self.ids)

    def _gather(self, timeout: float | None, interval: float, tick=None) -> list[dict]:
        """Poll the oldest pending results, a window at a time: jobs finish roughly in order, so each
        round reads few keys, not every pending one (which grows with the square of the batch)."""
        backend = app_mod.app.backend
        keys = [backend.get_key_for_task(i) for i in self.ids]
        metas: list[dict | None] = [None] * len(self.ids)
        pending = list(range(len(self.ids)))
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = interval
        failed = 0
        while pending:
            window = pending[:_WINDOW]
            found = False
            try:
                values = backend.client.mget([keys[i] for i in window])
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                values = [None] * len(window)  # Redis is restarting: the results wait for us there
            for i, raw in zip(window, values):
                if raw is not None:
                    meta = backend.decode_result(raw)
                    if meta["status"] in states.READY_STATES:
                        metas[i] = meta
                        found = True
                        failed += meta["status"] != states.SUCCESS
            pending = [i for i in pending if metas[i] is None] if found else pending
            if tick is not None:  # the progress bar (gpulayer/progress.py); it throttles itself
                tick(len(self.ids) - len(pending), failed)
            if not pending:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.ids) - len(pending)} of {len(self.ids)} jobs finished within {timeout}s")
            wait = interval if found else min(wait * 1.5, 0.2)
            time.sleep(wait)
        return metas


_WINDOW = 256


def submit_batch(signatures: Iterable[Signature], resources: Resources | dict | None = None,
                 chunk_size: int | None = None) -> BatchHandle:
    """Send many jobs with one pipelined publish per chunk, routed once for the whole batch.

    >>> h = submit_batch([submit.s(square, i) for i in range(2000)])
    >>> h.get()[:3]
    [0, 1, 4]
    """
    ensure_connected()
    res = as_resources(resources)
    route = app_mod.route_for(res)
    chunk = chunk_size or app_mod.settings().batch_chunk_size
    packed: dict[int, tuple[Any, PickledFunction | str]] = {}  # id -> (fn kept alive, its packed form)
    headers = {app_mod.RESOURCES_HEADER: res.model_dump(exclude_defaults=True)}
    celery_app = app_mod.app
    amqp = celery_app.amqp
    queue = amqp.router.expand_destination({"queue": route.queue})["queue"]
    ids: list[str] = []
    # Celery's apply_async subscribes to each result's channel and declares the
    # queue per message; a batch needs neither (results are gathered by MGET),
    # so it builds the task messages itself and lets kombu pipeline them.
    with celery_app.producer_or_acquire() as producer, producer.batch(max_size=chunk):
        for sig in signatures:
            if getattr(sig, "task", None) != submit.name:
                raise TypeError(f"submit_batch takes submit.s(...) signatures, got {sig!r}")
            fn, args = function_and_args(sig)
            kwargs = dict(sig.kwargs)
            if "resources" in kwargs:
                raise ValueError("give resources= to submit_batch, not to each signature: a batch routes once")
            if id(fn) not in packed:  # pickle each distinct function once per batch
                packed[id(fn)] = (fn, pack_function(fn))
            job_id = uuid()
            message = amqp.create_task_message(job_id, submit.name, (packed[id(fn)][1], *args), kwargs,
                                               reply_to=celery_app.thread_oid,
                                               argsrepr=summarize(fn, tuple(args), kwargs),
                                               kwargsrepr=res.describe())
            try:
                amqp.send_task_message(producer, submit.name, message, queue=queue, headers=dict(headers),
                                       declare=None if not ids else [])
            except EncodeError as err:
                cause = err.__cause__ or err.__context__ or err
                raise (cause if isinstance(cause, PayloadError) else PayloadError(str(err))) from err
            ids.append(job_id)
    return BatchHandle(ids)


def wait_for_workers(count: int, timeout: float = 30.0) -> None:
    """Block until at least ``count`` workers are live (for scripts and tests)."""
    ensure_connected()
    deadline = time.monotonic() + timeout
    while True:
        live = app_mod.registry().snapshot()
        if len(live) >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(live)} of {count} workers came up within {timeout:.0f}s")
        time.sleep(0.1)
