"""The client API: send jobs, gather results (connecting lives in ``connection.py``; ``connect`` and
``init`` are re-exported here)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from celery import states
from celery.canvas import Signature
from kombu.utils.uuid import uuid

from . import app as app_mod
from .cancel import cancel_jobs, interrupted
from . import retries
from .canvas import FUNCTION_OPTION, function_and_args
from .deadline import Deadline
from .engine import publish
from .session import BROKER_ERRORS, broker_lost, outage
from .session import connect, ensure_connected, init  # noqa: F401  (connect, init: public here too)
from .errors import UnsupportedOption
from .models import Resources
from .payload import PickledFunction, pack_function, summarize
from .store import durability
from .engine.results import prime_result
from .errors import JobFailed
from .store.sent import record_batch
from .sweep import Sweep
from .tasks import options as job_options
from .tasks import refs
from .job_handle import submit  # the task, handing out JobHandles
from .tasks.submit import OUTPUT_HEADER, as_resources, build_job, output_header, send_job
from .workspace import shipping
from .workspace.shipping import CODE_HEADER


class BatchHandle(Sweep):
    """The jobs of one ``submit_batch``, as a sequence of their handles in submission order.

    ``len(batch)``, ``batch[i]`` (negative too; a slice is a ``BatchHandle`` of those jobs) and ``for h in
    batch`` give per-job handles (``JobHandle``: ``get()``, ``cancel()``, ``history()``). ``get()`` returns
    every result in submission order; ``get(propagate=False)`` puts each failed job's exception (a
    ``JobFailed``) in its place instead of raising. ``as_completed()``, ``wait(n, timeout)``,
    ``completed_count()``, ``failed()``, ``failures()``, ``ready()``: see ``gpulayer/sweep.py``. ``cancel()``
    stops the ones not finished; ``id`` names the batch for `gpulayer cancel <id>` from a shell.
    """

    def __init__(self, ids: list[str], id: str | None = None, queue: str | None = None,
                 calls: list[str] | None = None, metas: list[dict | None] | None = None):
        self.ids = ids
        self.id = id  # submit_batch's: `gpulayer cancel <id>` finds the jobs by it (store/sent.py)
        self.queue = queue  # where the jobs were sent: a timeout's message says how many wait there
        self.calls = calls  # each job's ``fn(args)`` in short, made as it was sent: a failure names its job by it
        # the finished jobs' results, kept across get() calls
        self._metas: list[dict | None] = list(metas) if metas is not None else [None] * len(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return BatchHandle(self.ids[index], None, self.queue, self.calls[index] if self.calls else None,
                               self._metas[index])
        return self._sweep_handle(range(len(self.ids))[index], None)

    def __iter__(self):
        return (self._sweep_handle(i, None) for i in range(len(self.ids)))

    @property
    def results(self) -> list:
        """Every job's handle, in submission order (as a Celery group result's ``results``)."""
        return list(self)

    def __repr__(self) -> str:
        return f"<BatchHandle {self.id or '(part of a batch)'}: {len(self.ids)} jobs>"

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.02,
            progress: bool | None = None) -> list[Any]:
        """Results in submission order. The first failure (in submission order) raises its ``JobFailed``, which
        names the job's place and call (``... (job 3f2a... on w-b; item 7 of 20: load(7))``); with
        ``propagate=False`` every failed job's exception is returned in its place instead, the other jobs'
        values around it.

        ``progress``: draw a bar (done, failed, rate, ETA); by default only for more than 8 jobs
        and only when stdout is a terminal. When ``timeout`` runs out, ``gpulayer.JobTimeout`` says how
        many finished and what the others are doing (running where for how long, or queued); they run on.
        """
        try:
            from .terminal_progress import batch_progress

            with batch_progress(len(self.ids), progress) as tick:
                metas = self._gather(timeout, interval, tick)
        except KeyboardInterrupt:
            raise interrupted(self.ids, "batch.cancel()", self.id) from None  # the jobs run on without us
        out = []
        for i, meta in enumerate(metas):
            result = meta["result"]
            if meta["status"] != states.SUCCESS and isinstance(result, JobFailed):
                result.in_batch(i, len(metas), self.calls[i] if self.calls else None)
            if meta["status"] != states.SUCCESS and propagate:
                raise result.with_traceback(None) if isinstance(result, BaseException) else result
            out.append(refs.value_of(result))  # a large result (an auto ref): its value
        return out

    def forget(self) -> None:
        """Delete every job's stored result, and the objects only they held (large results, refs returned)."""
        for handle in self:
            handle.forget()

    # -- the Sweep's parts (gpulayer/sweep.py) --------------------------------------------------------------
    def _sweep_ids(self) -> list[str]:
        return self.ids

    def _sweep_backend(self):
        return app_mod.app.backend

    def _sweep_handle(self, index: int, meta: dict | None):
        handle = submit.AsyncResult(self.ids[index])
        meta = meta or self._metas[index]
        if meta is not None:
            if meta["status"] != states.SUCCESS and isinstance(meta["result"], JobFailed):
                meta["result"].in_batch(index, len(self.ids), self.calls[index] if self.calls else None)
            prime_result(handle, meta)  # its get() needs no round trip
        handle.sent_to = self.queue
        return handle

    def _sweep_timeout(self, pending: list[str], timeout: float | None) -> Exception:
        from .tasks.whereabouts import batch_timeout

        return batch_timeout(self.ids, pending, timeout, self.queue)

    def _sweep_interrupted(self) -> KeyboardInterrupt:
        return interrupted(self.ids, "batch.cancel()", self.id)

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
        metas = self._metas  # a stored result never changes: a later get() reads only the jobs not finished
        pending = [i for i, meta in enumerate(metas) if meta is None]
        deadline = Deadline(timeout)
        # Redis restarting: the results wait for us there; gone for good: say so, with what was in flight.
        lost = outage(deadline, lambda: f"{len(self.ids)} jobs sent, {len(self.ids) - len(pending)} finished; the "
                                        "others wait in Redis if the broker comes back with its data: call get() again")
        wait = interval
        failed = sum(1 for meta in metas if meta is not None and meta["status"] != states.SUCCESS)
        while pending:
            window = pending[:_WINDOW]
            found = False
            try:
                values = backend.client.mget([keys[i] for i in window])
            except BROKER_ERRORS as err:
                lost.lost(err)
                continue
            lost.back()
            for i, raw in zip(window, values):
                if raw is not None:
                    meta = backend.decode_result(raw)
                    if meta["status"] in states.READY_STATES:
                        metas[i] = meta
                        found = True
                        failed += meta["status"] != states.SUCCESS
            pending = [i for i in pending if metas[i] is None] if found else pending
            if tick is not None:  # the progress bar (gpulayer/terminal_progress.py); it throttles itself
                tick(len(self.ids) - len(pending), failed)
            if not pending:
                break
            if deadline.expired():
                from .tasks.whereabouts import batch_timeout

                raise batch_timeout(self.ids, [self.ids[i] for i in pending], timeout, self.queue)
            wait = interval if found else min(wait * 1.5, 0.2)
            time.sleep(deadline.left(wait))  # never past the timeout
        return metas


_WINDOW = 256


def submit_batch(signatures: Iterable[Signature], resources: Resources | dict | None = None,
                 chunk_size: int | None = None, *, working_dir=None, py_modules=None, excludes=None,
                 runtime_env: dict | None = None, **retry_options) -> BatchHandle:
    """Send many jobs with one pipelined publish per chunk, routed once for the whole batch.

    ``working_dir`` / ``py_modules`` / ``excludes``: the code the batch's jobs run with, as for
    ``gpulayer.init`` (default: ``init``'s, else the script's directory; ``gpulayer/workspace/``).
    ``retry_options``: ``max_retries``, ``autoretry_for`` (or Ray's ``retry_exceptions``), ``retry_backoff``
    and the others ``apply_async`` takes (gpulayer/retries.py ``OPTIONS``) for every job; a signature's own
    (``submit.s(fn, i).set(max_retries=5, ...)``) replace them for it. Any other keyword is refused.

    >>> h = submit_batch([submit.s(square, i) for i in range(2000)])
    >>> h.get()[:3]
    [0, 1, 4]
    """
    unknown = [name for name in retry_options if name not in retries.OPTIONS]
    if unknown:
        raise job_options.refusal(unknown[0], retry_options[unknown[0]])
    retry = retries.take(retry_options)
    ensure_connected()
    res = as_resources(resources)
    try:
        route = app_mod.route_for(res)
    except BROKER_ERRORS as err:
        raise broker_lost(err, "no job of the batch was sent") from err
    chunk = chunk_size or app_mod.settings().batch_chunk_size
    packed: dict[int, tuple[Any, PickledFunction | str]] = {}  # id -> (fn kept alive, its packed form)
    headers = {app_mod.RESOURCES_HEADER: res.model_dump(exclude_defaults=True)}
    if retry is not None:
        headers[retries.HEADER] = retry
    out = output_header(app_mod.app)
    if out is not None:
        headers[OUTPUT_HEADER] = out
    celery_app = app_mod.app
    options = {k: v for k, v in (("working_dir", working_dir), ("py_modules", py_modules),
                                 ("excludes", excludes), ("runtime_env", runtime_env)) if v is not None}
    code = shipping.digest_for(lambda: celery_app.backend.client, options)  # the user's modules, uploaded once
    if code is not None:
        headers[CODE_HEADER] = code
    summary = res.describe()
    ids: list[str] = []
    calls: list[str] = []  # each job's fn(args), short: a failure names its job by it
    batch_id = uuid()
    try:
        _send_batch(signatures, celery_app, chunk, packed, route, headers, summary, ids, batch_id, calls)
    except BROKER_ERRORS as err:
        # Published in chunks: those before the last chunk reached the broker, that one may have, the rest did not.
        cut = (f"the batch was cut off after {len(ids)} jobs (up to {chunk} of them may not have reached the broker, "
               "none after them did): send the batch again once it is back")
        raise broker_lost(err, cut) from err
    return BatchHandle(ids, batch_id, route.queue, calls[:len(ids)])


FIRST_CHUNK = 64  # jobs in a batch's first published chunk; each next one twice as many, up to batch_chunk_size


# A batch's signature may carry these options of its own: the rest of Celery's go through apply_async alone.
_SIGNATURE_OPTIONS = frozenset({"task_id", FUNCTION_OPTION, *retries.OPTIONS})


def _jobs(signatures, packed, headers: dict):
    """``(job id, packed function, args, kwargs, summary, headers)`` for each signature of a batch."""
    for sig in signatures:
        if getattr(sig, "task", None) != submit.name:
            raise TypeError(f"submit_batch takes submit.s(...) signatures, got {sig!r}")
        fn, args = function_and_args(sig)
        args, kwargs = tuple(args), dict(sig.kwargs)
        if "resources" in kwargs:
            raise ValueError("give resources= to submit_batch, not to each signature: a batch routes once")
        if id(fn) not in packed:  # pickle each distinct function once per batch
            packed[id(fn)] = (fn, pack_function(fn))
        options = sig.options or {}
        job_headers = headers
        if len(options) > 1 or (options and FUNCTION_OPTION not in options):  # more than submit.s's own
            job_headers = _own_options(options, headers)
        # A signature's own id (``submit.s(...).set(task_id=...)``, as Celery's) is kept: a batch that raised
        # NotReplicated or ClusterUnavailable is sent again with the same ids, and each job's result is stored once.
        job_id = options.get("task_id") or uuid()
        text = summarize(fn, args, kwargs)
        if not refs.plain_call(args, kwargs):  # large values to the object store, refs held: before it is sent
            args, kwargs = refs.for_job(args, kwargs, job_id, app_mod.app.backend.client)
        yield job_id, packed[id(fn)][1], args, kwargs, text, job_headers


def _own_options(options: dict, headers: dict) -> dict:
    """The headers of a batch's job whose signature has options of its own: its retry options replace the
    batch's; an option a batch does not send per job is refused (``UnsupportedOption``), never dropped."""
    for name in options:
        if name not in _SIGNATURE_OPTIONS:
            raise UnsupportedOption(f"{name}={options[name]!r} on a signature given to submit_batch: a batch sends "
                                    "its jobs in one publish and honours only a signature's task_id and retry "
                                    "options (max_retries, autoretry_for, retry_backoff, ...); send this job with "
                                    "sig.apply_async(), or drop the option")
    given = {name: options[name] for name in retries.OPTIONS if name in options}
    if not given:
        return headers
    own = {**headers}
    policy = retries.take(given)
    if policy is None:
        own.pop(retries.HEADER, None)
    else:
        own[retries.HEADER] = policy
    return own


def _send_batch(signatures, celery_app, chunk, packed, route, headers, summary, ids: list[str], batch_id: str,
                calls: list[str] | None = None) -> None:
    """Publish the batch, appending each job's id to ``ids`` as it is sent; each job is recorded as sent by this
    client in batch ``batch_id`` (`gpulayer cancel <batch id>` finds them, also after an error or a Ctrl-C)."""
    # Celery's apply_async subscribes to each result's channel and routes each message; a batch needs
    # neither (results are gathered by MGET, and it routes once). The messages of a chunk and their records
    # go in one pipeline (engine/publish.py), or through kombu's publish batch where only Celery's publish
    # may send them (the records then follow in one pipeline).
    queue = route.queue
    with celery_app.producer_or_acquire() as producer:
        publish.declare(celery_app, producer, queue)
        channel = publish.direct(celery_app, producer, queue, headers)
        if channel is None:
            waits, acked = durability.planned(app_mod.write_durability(), celery_app.backend.client), None
            try:
                with producer.batch(max_size=chunk):
                    for job_id, ref, args, kwargs, text, job_headers in _jobs(signatures, packed, headers):
                        send_job(producer, job_id, ref, args, kwargs, queue, job_headers, text, summary)
                        ids.append(job_id)
                        if calls is not None:
                            calls.append(text)
            finally:
                if ids:  # its WAIT (durability) covers the messages too: they went before these records
                    acked = record_batch(celery_app.backend.client, app_mod.client_identity(), batch_id, ids, waits)
            if acked is not None:
                durability.confirm(acked, waits, "submit_batch", ids, celery_app.backend.client)
            return
        sender = app_mod.client_identity()
        raws: list[str] = []
        sent = len(ids)  # ids[:sent] were flushed (or may have been: a flush whose reply was lost)
        size = min(chunk, FIRST_CHUNK)  # the first chunks are small, so workers start while the rest is built
        try:
            for job_id, ref, args, kwargs, text, job_headers in _jobs(signatures, packed, headers):
                raws.append(build_job(channel, job_id, ref, args, kwargs, queue, job_headers, text, summary))
                ids.append(job_id)
                if calls is not None:
                    calls.append(text)
                if len(raws) >= size:
                    chunk_ids, sent = ids[sent:], len(ids)
                    publish.publish_chunk(channel, queue, raws, chunk_ids, sender, batch_id)
                    raws, size = [], min(size * 2, chunk)
            chunk_ids, sent = ids[sent:], len(ids)
            publish.publish_chunk(channel, queue, raws, chunk_ids, sender, batch_id)
        finally:
            del ids[sent:]  # as kombu's publish batch does: what was not flushed was not sent


def wait_for_workers(count: int, timeout: float = 30.0) -> None:
    """Block until at least ``count`` workers are live (for scripts and tests)."""
    ensure_connected()
    deadline = Deadline(timeout)
    lost = outage(deadline, f"waiting for {count} workers")
    while True:
        try:
            live = app_mod.registry().current()
        except BROKER_ERRORS as err:
            lost.lost(err)
            continue
        if len(live) >= count:
            return
        if deadline.expired():
            raise TimeoutError(f"only {len(live)} of {count} workers came up within {timeout:.0f}s")
        time.sleep(0.1)
