"""The pure parts of output capture: lines from writes, the rate limit, the tail's bounds, the wire format.

Nothing here touches Redis, threads or streams; ``sink.py`` and ``capture.py`` are the edges.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

OUT, ERR = "out", "err"  # a line's stream: the job's stdout or stderr (logging records go to stderr)

MAX_LINE = 16 * 1024  # characters of one line kept and sent; the rest is cut, saying so
TAIL_LINES = 10_000  # lines of a job's (a rank's) tail kept in Redis, at most
TAIL_BYTES = 1 << 20  # characters of a job's tail kept, at most (the newest lines stay)
RATE_LINES, BURST_LINES = 500.0, 2000.0  # lines per second a job may send home, and its burst
RATE_BYTES, BURST_BYTES = 256.0 * 1024, 1024.0 * 1024  # characters per second, and the burst
NOTE_EVERY = 1.0  # seconds between two lines saying how many were dropped (and one as the job ends)


class LineSplitter:
    """Writes in, whole lines out. A carriage return starts the line over (what a terminal shows of a bar that
    redraws itself in place); a line longer than ``MAX_LINE`` is cut there."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = ""

    def write(self, text: str) -> list[str]:
        if "\n" not in text:
            self._partial = self._join(self._partial, text)
            return []
        parts = text.split("\n")
        lines = [self._join(self._partial, parts[0])]
        lines.extend(self._join("", p) for p in parts[1:-1])
        self._partial = self._join("", parts[-1])
        return [cut(line) for line in lines]

    def rest(self) -> str | None:
        """What was written after the last newline (the job ended without one), once."""
        rest, self._partial = self._partial, ""
        return cut(rest) if rest else None

    @staticmethod
    def _join(before: str, text: str) -> str:
        if "\r" in text:
            # "\r\n" ends a line as "\n" does; a bare "\r" redraws it: keep what follows the last one.
            text = text.rstrip("\r")
            if "\r" in text:
                return text.rsplit("\r", 1)[1]
        joined = before + text
        return joined if len(joined) <= 4 * MAX_LINE else joined[:4 * MAX_LINE]  # a partial line stays bounded


def cut(line: str) -> str:
    if len(line) <= MAX_LINE:
        return line
    return f"{line[:MAX_LINE]} [gpulayer: line cut, {len(line) - MAX_LINE} more characters]"


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``take(n)`` spends ``n`` if there are that many."""

    __slots__ = ("rate", "burst", "tokens", "at", "clock")

    def __init__(self, rate: float, burst: float, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = burst
        self.at = clock()

    def take(self, n: float = 1.0) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


class Limiter:
    """A job's send-home budget: lines a second and characters a second, each with a burst. What is over it is
    dropped and counted; ``note()`` is the one line that says so (then the count starts again)."""

    __slots__ = ("lines", "chars", "dropped", "noted")

    def __init__(self, rate_lines: float = RATE_LINES, burst_lines: float = BURST_LINES,
                 rate_bytes: float = RATE_BYTES, burst_bytes: float = BURST_BYTES, clock=time.monotonic):
        self.lines = TokenBucket(rate_lines, burst_lines, clock)
        self.chars = TokenBucket(rate_bytes, burst_bytes, clock)
        self.dropped = 0
        self.noted = -NOTE_EVERY  # when the last note was given (the clock's time)

    def admit(self, text: str) -> bool:
        # Characters first: a line refused for its size leaves the line budget as it was.
        if self.chars.take(len(text) + 1):
            if self.lines.take():
                return True
            self.chars.tokens += len(text) + 1
        self.dropped += 1
        return False

    def note_due(self) -> str | None:
        """``note()``, unless one was given less than ``NOTE_EVERY`` seconds ago (a flood gets one a second)."""
        if not self.dropped or self.lines.at - self.noted < NOTE_EVERY:
            return None
        return self.note()

    def note(self) -> str | None:
        if not self.dropped:
            return None
        self.noted = self.lines.at
        n, self.dropped = self.dropped, 0
        return (f"[gpulayer: {n} line{'s' if n != 1 else ''} dropped: this job printed more than "
                f"{self.lines.rate:g} lines or {self.chars.rate / 1024:g} KiB a second]")


class TailBudget:
    """How many of a job's newest lines its tail keeps: at most ``TAIL_LINES`` and ``TAIL_BYTES`` characters."""

    __slots__ = ("sizes", "total", "max_lines", "max_bytes", "full")

    def __init__(self, max_lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES):
        self.sizes: collections.deque[int] = collections.deque()
        self.total = 0
        self.max_lines, self.max_bytes = max_lines, max_bytes
        self.full = False  # this run's lines alone went past a bound

    def add(self, size: int) -> int:
        """Count a new line of ``size`` characters; returns how many lines the tail keeps now."""
        self.sizes.append(size)
        self.total += size
        while self.sizes and (len(self.sizes) > self.max_lines or self.total > self.max_bytes) and len(self.sizes) > 1:
            self.total -= self.sizes.popleft()
            self.full = True
        return len(self.sizes)

    def maxlen(self) -> int:
        """The length to trim the tail to. A job run again (a retry, a redelivery, a gang's next attempt)
        adds to the lines of its earlier runs: they stay until this run's lines alone fill the tail."""
        return len(self.sizes) if self.full else self.max_lines


@dataclass(frozen=True)
class Source:
    """Where a job's lines come from: its id, function, worker and process; a distributed job's rank."""

    job: str
    fn: str
    worker: str
    pid: int
    rank: int | None = None

    def wire(self) -> dict:
        d = {"j": self.job, "n": self.fn, "w": self.worker, "p": self.pid}
        if self.rank is not None:
            d["r"] = self.rank
        return d

    @classmethod
    def from_wire(cls, d: dict) -> Source:
        return cls(d["j"], d.get("n", "?"), d.get("w", "?"), int(d.get("p", 0)), d.get("r"))

    def prefix(self) -> str:
        """As the client shows it: ``(square pid=123 on local-1)``, ``(rank 2 on w-b)``."""
        if self.rank is not None:
            return f"(rank {self.rank} on {self.worker})"
        return f"({self.fn} pid={self.pid} on {self.worker})"


@dataclass
class Chunk:
    """Lines of one source waiting to go: ``(stream, text, time)`` each."""

    source: Source
    channel: str | None  # the client's output channel, or None: kept in the tail only
    lines: list = field(default_factory=list)

    def wire(self) -> dict:
        return {**self.source.wire(), "l": [[s, t] for s, t, _ in self.lines]}


def decode_batch(chunks: list[dict]):
    """``(Source, stream, text)`` for each line of a published batch (a list of ``Chunk.wire()``)."""
    for d in chunks:
        source = Source.from_wire(d)
        for stream, text in d.get("l", ()):
            yield source, stream, text
