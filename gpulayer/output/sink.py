"""A process's outbox of output lines: batched, sent home, kept as each job's tail.

Every process that runs user code (a worker's pool process, a worker's gang agent for its ranks) has one
:class:`Sink`. A job's :class:`JobOutput` hands it each line its limiter admits; a thread sends what is
waiting every ``FLUSH`` seconds (or at once past ``BATCH_LINES``), and a job that printed sends its last lines
itself as it ends, before its result is stored: ``h.get()`` then ``h.logs()`` sees them all. One pipeline per
send: for each job, XADD of its lines to its tail (trimmed to its ``TailBudget``, expiring with its result);
for each client, one PUBLISH of its jobs' lines. A job that prints nothing costs nothing here.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Callable

import redis

from ..masking import mask_text
from ..store import keys
from .lines import ERR, OUT, Chunk, LineSplitter, Limiter, Source, TailBudget

log = logging.getLogger(__name__)

FLUSH = 0.2  # seconds a line waits, at most, before it is sent (and so before the client shows it)
BATCH_LINES = 1000  # waiting lines that wake the sender at once


class JobOutput:
    """One job's (or rank's) output in the process that runs it: ``write(stream, text)``, ``line``, ``close()``.

    Made for every job, so it does nothing until the job's first line: the limiter, the tail's budget and the
    sink come then (``sink_of()`` gives the process's sink)."""

    __slots__ = ("_sink_of", "_args", "channel", "sink", "source", "limiter", "budget", "printed", "_split")

    def __init__(self, sink_of: Callable[[], Sink], job: str, fn, worker: str, pid: int,
                 channel: str | None, rank: int | None = None):
        self._sink_of, self._args, self.channel = sink_of, (job, fn, worker, pid, rank), channel
        self.sink = None
        self.printed = False

    def _ready(self) -> None:
        job, fn, worker, pid, rank = self._args
        pid = pid or os.getpid()  # (0: the process that prints)
        if not isinstance(fn, str):  # the function itself: named only once it prints
            from ..payload import function_name

            fn = function_name(fn).rsplit("<locals>.", 1)[-1]  # a nested function by its own name
        self.source = Source(job, fn, worker, pid, rank)
        self.limiter = Limiter()
        self.budget = TailBudget()
        self._split = {OUT: LineSplitter(), ERR: LineSplitter()}
        self.sink = self._sink_of()

    def write(self, stream: str, text: str) -> list[str]:
        """Take a write of ``stream``; returns the lines admitted (to pass on to the worker's own log)."""
        if self.sink is None:
            self._ready()
        admitted = []
        for line in self._split[stream].write(text):
            if self.line(stream, line):
                admitted.append(line)
        return admitted

    def line(self, stream: str, text: str) -> bool:
        if self.sink is None:
            self._ready()
        if not self.limiter.admit(text):
            return False
        note = self.limiter.note_due() if self.limiter.dropped else None
        self.printed = True
        if note:
            self.sink.add(self, ERR, note)
        if "://" in text:  # a URL's password a job prints is masked, as in the worker's log (masking.py)
            text = mask_text(text)
        self.sink.add(self, stream, text)
        return True

    def close(self) -> None:
        """The job ended: what it wrote without a final newline, the count of lines dropped, sent now."""
        if self.sink is None:
            return  # it printed nothing
        for stream, split in self._split.items():
            rest = split.rest()
            if rest is not None:
                self.line(stream, rest)
        note = self.limiter.note()
        if note:
            self.printed = True
            self.sink.add(self, ERR, note)
        if self.printed:
            self.sink.flush()


class Sink:
    """See the module docstring. ``client()`` gives the redis-py client to send with; ``expires`` is how long
    a tail is kept (seconds: the results' ``result_expires``)."""

    def __init__(self, client: Callable[[], redis.Redis], expires: int):
        self.client, self.expires = client, int(expires)
        self.pid = os.getpid()
        self._lock = threading.Lock()  # guards _pending
        self._sending = threading.Lock()  # one send at a time, so a job's lines reach Redis in order
        self._pending: dict[int, tuple[JobOutput, Chunk]] = {}
        self._waiting = 0
        self._wake = threading.Event()  # lines wait: the sender sends them within FLUSH
        self._full = threading.Event()  # so many wait that the sender sends them at once
        self._thread: threading.Thread | None = None
        self.sent = self.failed = 0  # batches, for tests and benchmarks

    def add(self, out: JobOutput, stream: str, text: str) -> None:
        with self._lock:
            out.budget.add(len(text))
            keep = out.budget.maxlen()
            entry = self._pending.get(id(out))
            if entry is None:
                entry = self._pending[id(out)] = (out, Chunk(out.source, out.channel))
            entry[1].lines.append((stream, text, keep))
            self._waiting += 1
            first, many = self._waiting == 1, self._waiting >= BATCH_LINES
        if self._thread is None:
            self._start()
        if first:
            self._wake.set()
        if many:
            self._full.set()

    def flush(self) -> None:
        """Send what waits now (the calling thread does: a job's last lines go before its result)."""
        with self._sending:
            with self._lock:
                pending, self._pending, self._waiting = self._pending, {}, 0
            if pending:
                self._send([chunk for _, chunk in pending.values()])

    def _send(self, chunks: list[Chunk]) -> None:
        by_channel: dict[str, list[dict]] = {}
        try:
            pipe = self.client().pipeline(transaction=False)
            for chunk in chunks:
                key = keys.job_output(chunk.source.job, chunk.source.rank)
                for stream, text, _ in chunk.lines:
                    pipe.xadd(key, {"s": stream, "t": text})
                pipe.xtrim(key, maxlen=chunk.lines[-1][2], approximate=False)
                pipe.expire(key, self.expires)
                if chunk.channel:
                    by_channel.setdefault(chunk.channel, []).append(chunk.wire())
            for channel, wire in by_channel.items():
                pipe.publish(keys.output_channel(channel), json.dumps(wire, separators=(",", ":")))
            pipe.execute()
            self.sent += 1
        except redis.RedisError as err:  # output is best effort: the job and its result go on without it
            self.failed += 1
            log.debug("gpulayer: %d jobs' output lines not sent: %s", len(chunks), err)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="gpulayer-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Asleep while no line waits: a process whose job printed once does not wake every FLUSH forever after
        # (each wake takes the GIL from the jobs it runs next).
        while True:
            self._wake.wait()
            self._wake.clear()
            self._full.wait(FLUSH)  # the batch's window, cut short by a full one
            self._full.clear()
            try:
                self.flush()
            except Exception:  # never let the sender die: the next lines would wait forever
                log.exception("gpulayer: sending output lines failed")
            with self._lock:
                if self._waiting:  # lines added while it sent: their window starts now
                    self._wake.set()


_sink: Sink | None = None
_sink_lock = threading.Lock()


def _forked() -> None:
    """A forked child (a pool process the worker starts again, after its agent's ranks printed) makes its own
    sink: the parent's thread did not come along, and its locks may have been held at the fork."""
    global _sink, _sink_lock
    _sink, _sink_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forked)


def process_sink(client: Callable[[], redis.Redis], expires: int) -> Sink:
    """This process's sink, made on first use (a forked child makes its own: a parent's lock and thread do not
    survive the fork)."""
    global _sink
    sink = _sink
    if sink is None or sink.pid != os.getpid():
        with _sink_lock:
            if _sink is None or _sink.pid != os.getpid():
                _sink = Sink(client, expires)
            sink = _sink
    return sink
