"""One error hierarchy. Each message says what was asked, what was found, and what to do.

Errors print as one line: a remote job's traceback is kept in ``.traceback``
and chained as the ``__cause__`` (a ``RemoteTraceback``, as
``concurrent.futures`` does), so Python's own display shows it above the
one-line summary, and ``str(err)`` stays short enough for a log line.
"""

from __future__ import annotations

from .masking import mask_text

_MAX_LINE = 500  # characters of a message shown in the one-line str; the full text stays in .message


def one_line(text: str, limit: int = _MAX_LINE) -> str:
    """``text`` with its whitespace (newlines too) collapsed, cut at ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def tries_text(outcomes: list[str], total: int) -> str:
    """``failed after 2 tries: try 1 ConnectionError('x') on w-1; try 2 ConnectionError('y') on w-2``.

    ``outcomes``: every try's (past ``gpulayer.retries.TRIES_KEPT`` tries, the first and the last ones'),
    ``total`` tries in all."""
    cut = total - len(outcomes)  # tries left out in the middle
    head = len(outcomes) // 2 if cut else len(outcomes)
    shown = [f"try {i + 1} {o}" for i, o in enumerate(outcomes[:head])]
    if cut:
        shown.append(f"({cut} more)")
        shown += [f"try {total - len(outcomes) + head + i + 1} {o}" for i, o in enumerate(outcomes[head:])]
    return f"failed after {total} tries: " + "; ".join(shown)


class GpulayerError(Exception):
    """Base class of every error gpulayer raises on purpose.

    A password inside a URL in its message (``redis://:PASSWORD@host``) is masked as it is made, so no
    ``str``, ``repr``, log line or traceback of it shows one.
    """

    def __init__(self, *args):
        super().__init__(*(mask_text(a) if isinstance(a, str) else a for a in args))


class ConfigError(GpulayerError, ValueError):
    """Configuration (environment, config file, state file, CLI flags) is invalid."""


class InvalidRequest(GpulayerError, ValueError):
    """A request (``Resources(...)``, a job's options) names a field that does not exist or a value it cannot have;
    the message names the field and the rule. ``errors``: pydantic's account, one dict per fault."""

    def __init__(self, message: str, errors: list | None = None):
        super().__init__(message)
        self.errors = list(errors or [])

    def __str__(self) -> str:
        return one_line(super().__str__(), limit=2000)


class ClusterUnavailable(GpulayerError, ConnectionError):
    """The broker cannot be reached or refuses our credentials."""


class NotReplicated(GpulayerError):
    """A write reached the primary but no replica confirmed it in time (``durability = "replicated"``): it may not
    survive a failover. ``job_ids``: the jobs it sent, which are safe to send again with the same ids."""

    def __init__(self, message: str, job_ids: tuple[str, ...] = ()):
        super().__init__(message)
        self.job_ids = tuple(job_ids)


class DurabilityDegraded(UserWarning):
    """A warning, not an error: no replica of the broker's primary is in sync (``durability = "replicated"``,
    ``min_replicas = 0``), so writes go on acknowledged by the primary alone until one is back. Given once per
    episode; ``warnings.simplefilter("error", DurabilityDegraded)`` makes it an error, ``min_replicas = 1`` a
    ``NotReplicated`` refusal of each such write."""


class JobRejected(GpulayerError):
    """No live worker can run the request; refused at submission, never queued."""

    def __str__(self) -> str:
        return one_line(super().__str__(), limit=2000)


class UnsupportedOption(GpulayerError, ValueError):
    """An ``apply_async`` option gpulayer cannot honour as given; refused rather than dropped."""


class PayloadError(GpulayerError, ValueError):
    """A job's function, arguments or result cannot be serialised or is too large."""


class PayloadRejected(GpulayerError):
    """A message body failed signature verification and was not unpickled."""


class NotAllowed(GpulayerError):
    """A user asked for what only another user (the job's owner) or an admin may do."""


class ObjectStoreFull(PayloadError):
    """A value does not fit in the object store (its size limit, or its disk's free space): nothing was written."""


class ObjectStoreUnavailable(GpulayerError, ConnectionError):
    """The object store's server (S3-compatible) did not answer, or answered with an error we did not expect."""


class ObjectMissing(GpulayerError, LookupError):
    """An object a ref names is gone from the store (freed, or its last holder expired)."""


class JobTimeout(GpulayerError, TimeoutError):
    """A wait for a job's result (``get(timeout=...)``) ran out; the message says what the job is doing.

    The job is not stopped: it runs on (``handle.cancel()`` stops it) and ``get()`` may be called again.
    ``job_id`` names it; ``waited`` is the timeout in seconds.
    """

    def __init__(self, message: str, job_id: str | None = None, waited: float | None = None):
        self.job_id = job_id
        self.waited = waited
        super().__init__(message)


class JobStopped(GpulayerError):
    """A job was cancelled or ran over its timeout, and its processes were killed."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a worker; chained as a ``JobFailed``'s cause.

    ``text`` is the whole traceback; what Python shows (``str``) leaves out the engine's frames
    (``gpulayer/tracebacks.py``), so the user's own frames come first.
    """

    def __init__(self, text: str):
        self.text = text
        super().__init__(text)

    def __str__(self) -> str:
        from .tracebacks import shown

        return '\n"""\n' + shown(self.text).rstrip() + '\n"""'


class JobFailed(GpulayerError):
    """A job ran and raised, or its process died.

    ``str(err)`` is one line: the remote type and message, the job id and the
    worker it ran on, and for a job sent with ``max_retries`` every try
    ("failed after 2 tries: try 1 ConnectionError('x') on w-a; try 2 ...").
    ``type_name``, ``message``, ``traceback``, ``job_id``, ``worker``, ``tries``
    and ``try_count`` hold the parts; the traceback is also the ``__cause__``.

    **It keeps the job's own type.** When the job raised an ``Exception`` whose class the client can import
    (and subclass), the error raised in the client is an instance of both ``JobFailed`` and that class
    (``JobFailed[KeyError]``, built once per class: ``gpulayer/remote_errors.py``), so ``except KeyError``
    catches a job's ``KeyError``; its ``args`` and attributes are the remote exception's (``e.args[0]``, an
    ``OSError``'s ``errno`` and ``filename``), and ``exception`` is the remote exception rebuilt. Otherwise
    (a class only the worker has, or a ``BaseException`` that is not an ``Exception``: ``SystemExit``,
    ``KeyboardInterrupt``, which would stop the client) it is a plain ``JobFailed``, ``type_name`` naming it.

    A job of a batch or group names its place: ``index`` (submission order) and ``call``, a short form of
    its function and arguments.
    """

    remote_type: type | None = None  # the job's own exception class, for a typed JobFailed[T]
    exception: BaseException | None = None  # the remote exception, rebuilt on the client (when it could be)
    index: int | None = None  # in a batch or group: the job's place in submission order
    call: str | None = None  # in a batch: ``fn(args)``, short
    tries: tuple[str, ...] = ()  # sent with max_retries: each try's error and worker (some, past 20 tries)
    try_count = 1  # how many tries the job had

    def __init__(self, type_name: str, message: str, traceback: str | None = None, job_id: str | None = None,
                 worker: str | None = None):
        super().__init__(type_name, message, traceback, job_id, worker)
        self._fill(type_name, message, traceback, job_id, worker)

    def _fill(self, type_name: str, message: str, traceback: str | None, job_id: str | None,
              worker: str | None) -> None:
        self.type_name = type_name
        self.message = mask_text(message)  # a remote error may quote a URL too
        self.traceback = mask_text(traceback) if traceback else traceback
        self.job_id = job_id
        self.worker = worker
        if traceback:
            self.__cause__ = RemoteTraceback(self.traceback)  # also suppresses the context, as `raise ... from` does

    def in_batch(self, index: int, total: int, call: str | None = None) -> "JobFailed":
        """Name this failure's place in a batch or group of ``total`` jobs (``str`` then says it); returns it."""
        self.index, self._total, self.call = index, total, call
        return self

    def _where(self) -> str:
        job = f"job {self.job_id}" if self.job_id else "a job"
        where = f"{job} on {self.worker}" if self.worker else job
        if self.index is not None:
            total = getattr(self, "_total", None)
            where += f"; item {self.index}" + (f" of {total}" if total is not None else "")
            if self.call:
                where += f": {one_line(self.call, 120)}"
        return where

    def __str__(self) -> str:
        text = f"{self.type_name}: {one_line(self.message)} ({self._where()})"
        if self.tries:
            text += "; " + one_line(tries_text(list(self.tries), self.try_count), limit=4000)
        return text


class GangFailed(JobFailed):
    """A distributed job failed: one rank raised or died, or a worker of the gang was lost.

    ``rank``, ``worker`` and ``exit_code`` name the failed rank; ``traceback``
    holds its remote traceback and the last lines of its stderr.
    """

    rank: int | None = None
    exit_code: int | None = None
    exc_report: dict | None = None  # the failed rank's report of its exception, for the client to type the error

    def __str__(self) -> str:
        return f"distributed job {self.job_id}: {one_line(self.message)}"


class UnknownId(GpulayerError, LookupError):
    """No job, distributed job or batch has this id, nor an id that starts with it."""


class AmbiguousId(UnknownId):
    """A short id (a prefix) matches several jobs, distributed jobs or batches: give more of it.

    ``matches``: the full ids it matches (the first few).
    """

    def __init__(self, message: str, matches: tuple[str, ...] = ()):
        super().__init__(message)
        self.matches = tuple(matches)
