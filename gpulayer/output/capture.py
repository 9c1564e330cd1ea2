"""In a worker's pool process: a job's ``print`` and ``logging`` lines, captured while it runs.

Installed once per process, on its first job: ``sys.stdout`` and ``sys.stderr`` become :class:`_Stream`s and
the root logger gets a :class:`_Handler`; outside a job both pass everything on as before. Inside one
(:class:`job`), each line goes to the job's :class:`~gpulayer.output.sink.JobOutput` (limited, batched, sent
home) and, when admitted, on to the worker's own log as before. Entering and leaving a job is two assignments:
a job that prints nothing costs no Redis call and no thread.
"""

from __future__ import annotations

import logging
import os
import sys

from .lines import ERR, OUT
from .sink import JobOutput, process_sink

_current: JobOutput | None = None  # the job running in this process now
_passing = False  # a line on its way to the worker's log (whose logging proxy must not capture it again)
_installed = False  # in this process (a forked child installs again: see _forked)


def _forked() -> None:
    global _installed, _current
    _installed, _current = False, None


os.register_at_fork(after_in_child=_forked)


class _Stream:
    """``sys.stdout`` / ``sys.stderr`` of a pool process: the running job's lines are captured."""

    def __init__(self, original, stream: str):
        self._original, self._stream = original, stream

    def write(self, text) -> int:
        out = _current
        if out is None or _passing or not isinstance(text, str):
            return self._original.write(text)
        for line in out.write(self._stream, text):
            _pass_on(self._original, line + "\n")
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._original.flush()
        except (AttributeError, ValueError, OSError):
            pass

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):  # encoding, fileno, buffer, ...: the original stream's
        return getattr(self._original, name)


def _pass_on(original, text: str) -> None:
    global _passing
    _passing = True
    try:
        original.write(text)
    except (ValueError, OSError):
        pass
    finally:
        _passing = False


class _Handler(logging.Handler):
    """On the root logger and Celery's task logger (``get_task_logger``'s parent, which does not propagate): a
    record logged while a job runs is one of its stderr lines (its own handlers, the worker's log among them,
    still get it). A warning (``warnings.warn``, which the worker logs as ``py.warnings``) reads as Python
    prints it."""

    def __init__(self):
        super().__init__(logging.NOTSET)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self._last = None  # the record last taken: one that reaches both loggers is one line

    def emit(self, record: logging.LogRecord) -> None:
        out = _current
        if out is None or _passing or record.name == "celery.redirected" or record is self._last:
            return
        self._last = record
        try:
            text = record.getMessage() if record.name == "py.warnings" else self.format(record)
        except Exception:
            return
        for line in text.rstrip("\n").split("\n"):
            out.line(ERR, line)

    def handle(self, record):  # no lock: one thread per pool process, and the sink has its own
        if _current is not None:
            self.emit(record)
        return True


TASK_LOGGER = "celery.task"  # the parent of celery.utils.log.get_task_logger's loggers


def install() -> None:
    """Wrap this process's streams and add the handler (once per process: a forked child does it again)."""
    global _installed
    if _installed:
        return
    _installed = True
    if not isinstance(sys.stdout, _Stream):
        sys.stdout = _Stream(sys.stdout, OUT)
    if not isinstance(sys.stderr, _Stream):
        sys.stderr = _Stream(sys.stderr, ERR)
    handler = _Handler()
    for logger in (logging.getLogger(), logging.getLogger(TASK_LOGGER)):
        if not any(isinstance(h, _Handler) for h in logger.handlers):
            logger.addHandler(handler)


_client = None  # () -> the redis-py client a pool process's sink sends with (``use``)
_expires = None  # () -> seconds a tail is kept


def use(client, expires) -> None:
    """Where this process's captured lines go: ``client()`` sends them, ``expires()`` says how long a tail is
    kept (both asked only once a job prints)."""
    global _client, _expires
    _client, _expires = client, expires


def _sink():
    return process_sink(_client, _expires())


class job(JobOutput):
    """``with job(job_id, fn, worker, channel):`` capture the job's lines (``channel``: the sender's output id;
    None: they are only kept in the job's tail). A job that prints nothing costs two assignments."""

    __slots__ = ("previous",)

    def __init__(self, job_id: str, fn, worker: str, channel: str | None):
        self._sink_of, self._args, self.channel = _sink, (job_id, fn, worker, 0, None), channel
        self.sink = None
        self.printed = False

    def __enter__(self) -> JobOutput:
        global _current
        if not _installed:
            install()
        self.previous = _current
        _current = self
        return self

    def __exit__(self, *exc) -> None:
        global _current
        _current = self.previous
        if self.sink is not None:
            try:
                self.close()
            except Exception:  # the job's outcome matters more than its last lines
                pass
