"""The rank runner: start a machine's ranks, stream their output, stop them all on the first failure.

Both places that run ranks use it: the gang agent (one node of a distributed
job; it reports through Redis) and the local ``Trainer(devices=M)`` launcher
(it reports to its caller). A rank is a ``python <argv>`` command line with
torchrun's environment (``launch.rank_env``), forked from the warm template
(``warm.py``) or started as a fresh interpreter.

Who failed first is decided from facts, not from sleeps: a rank that catches
an exception records the time before it reports (:func:`report_failure`, read
by the runner once the rank has exited), and a rank that dies without a report
is dated by the runner when it sees the exit (also when it ended just before
or while the runner stopped the others: the kernel's pidfd, or an exit code of
its own rather than the stop's signal, says so). Among the failures, those that
look like a lost connection to a peer (``collateral``: gloo/NCCL errors raised
because another rank went away) lose to the others; then the earliest wins.
On one machine the comparison uses ``CLOCK_BOOTTIME``, one clock for every
process; across machines only wall clocks (``time.time()``) exist, so the
order there is as good as their synchronisation (NTP: milliseconds).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
import weakref
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from ..deadline import Deadline
from .stop import die_with_parent, stop_group

REPORTS_ENV = "GPULAYER_RANK_REPORTS"  # the runner's unix datagram socket for failure reports
MAX_REPORT = 64 * 1024  # bytes of one report; a longer traceback keeps its end
TAIL_LINES = 40
FAIL_GRACE = 0.1  # seconds between SIGTERM and SIGKILL once a rank failed: nothing is left to save
SETTLE = 0.3  # at most this long for a rank of ours to end when the only failures are ranks that lost a peer
DRAIN_S = 0.5  # at most this long for the pipes to empty after the ranks are gone


def boot_clock() -> float:
    """Seconds on a clock every process on this machine shares (``CLOCK_BOOTTIME`` on Linux)."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


# -- inside a rank -----------------------------------------------------------------------------------
def peer_lost(exc: BaseException) -> bool:
    """Does ``exc`` look like a lost connection to another rank (gloo/NCCL), not a failure of this rank?"""
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ in ("DistBackendError", "DistNetworkError") or any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "gloo/transport",
                            "NCCL communicator was aborted", "Broken pipe",
                            "typically caused by a remote worker"))  # gloo's words for a peer that crashed or hangs


def report_failure(exc: BaseException | None = None, *, exit_code: int | None = None, message: str | None = None,
                   tb: str | None = None, extra: dict | None = None) -> dict:
    """In a rank: tell the runner why it fails, with the time, before exiting.

    Call it from the ``except`` that catches the rank's exception (the time is
    taken first). ``extra``: more fields of the report (a gang's rank adds its exception's class and pack,
    ``exc_module``, ``exc_qualname``, ``exc_pack``: gpulayer/remote_errors.py). The report goes at once to the runner's socket
    (``$GPULAYER_RANK_REPORTS``), so the runner stops the other ranks without
    waiting for this one to tear down; returns the report.
    """
    failed_at, failed_at_boot = time.time(), boot_clock()
    rank = int(os.environ.get("RANK", "0"))
    report = {"rank": rank, "failed_at": failed_at, "failed_at_boot": failed_at_boot, "host": socket.gethostname(),
              "exit_code": exit_code}
    if exc is not None:
        report.update(kind="exception", type=type(exc).__name__, message=str(exc), collateral=peer_lost(exc),
                      traceback=tb if tb is not None else "".join(traceback.format_exception(exc)))
        if exit_code is None:
            report["exit_code"] = 1  # what the interpreter exits with (the runner may stop it first)
    else:
        report.update(kind="exit", type=None, message=message or f"exit code {exit_code}", collateral=False,
                      traceback=tb or "")
    report.update(extra or {})
    address = os.environ.get(REPORTS_ENV)
    if address:
        data = json.dumps(report).encode()
        if len(data) > MAX_REPORT and report.get("exc_pack"):  # the class's name still travels
            report.pop("exc_pack")
            data = json.dumps(report).encode()
        if len(data) > MAX_REPORT:
            cut = len(data) - MAX_REPORT + 100
            report["traceback"] = "...\n" + report["traceback"][cut:]
            data = json.dumps(report).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(data, _sockaddr(address))
        except OSError:
            pass  # no runner listening: it dates the exit itself
    return report


def _sockaddr(address: str) -> str:
    """The runner's report address as the socket API takes it: ``@name`` is Linux's abstract ``\\0name``."""
    return "\0" + address[1:] if address.startswith("@") else address


def fast_exit(code: int) -> None:
    """Exit as the interpreter would, minus tearing down every module (seconds once torch is imported).

    Non-daemon threads are joined and ``atexit`` handlers run, as at a normal
    exit; then the process ends. A rank's result is already stored, and its
    runner waits for the exit, so the teardown would only delay the job.
    """
    import atexit

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    _skip_torch_library_finalizers()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _skip_torch_library_finalizers() -> None:
    """torch keeps a ``weakref.finalize`` per operator library (about 130) that unregisters its operators
    at exit: pointless in a process about to end, and in a rank forked from the warm template each one
    writes to pages shared with the template, ~0.1 s of copies per rank on a busy machine. Only these are
    switched off (``finalize.atexit``); the user's finalizers and atexit handlers still run.

    CPython's table of live finalizers (``finalize._registry``) and ``atexit._run_exitfuncs`` are private: pinned in
    gpulayer/engine/upstream.py, and tests/test_engine_contract.py checks that torch's finalizers are found here."""
    registry = getattr(weakref.finalize, "_registry", None)
    if "torch.library" not in sys.modules or not isinstance(registry, dict):
        return
    for finalizer, info in list(registry.items()):
        if getattr(info.func, "__module__", None) == "torch.library":
            finalizer.atexit = False


# -- the runner --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankCommand:
    """One process to start: ``python <argv>`` with ``env`` in ``cwd``, running global ``ranks``.

    One rank per process for the direct launcher; torchrun's process runs all
    of a node's ranks (its output lines carry the local rank: ``split_line``).
    """

    ranks: tuple[int, ...]
    argv: tuple[str, ...]
    env: dict[str, str] = field(hash=False, compare=False)
    cwd: str | None = None
    warm: bool = True  # may fork from the warm template (torchrun never does)
    # Dies of the stop's SIGTERM (its default action), so an exit code of its own during a stop means it ended on
    # its own; torchrun handles SIGTERM and exits 1, so its code says nothing about who ended it.
    dies_of_sigterm: bool = True


@dataclass
class RankFailure:
    """Why one rank failed: what the rank reported, or what the runner saw of its exit."""

    rank: int
    kind: str  # "exception" | "exit" (sys.exit, or died without a report) | "timeout"
    exit_code: int | None = None
    type: str | None = None
    message: str = ""
    traceback: str = ""
    stderr_tail: str = ""
    exc_module: str = ""  # the exception's class (the client raises a GangFailed that is one too) and its pack
    exc_qualname: str = ""
    exc_pack: str = ""  # base64
    failed_at: float = 0.0  # time.time() when the rank failed (or the runner saw it die)
    failed_at_boot: float = 0.0  # the same on this machine's shared clock
    collateral: bool = False  # a lost connection to a peer: probably not the first failure
    host: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunOutcome:
    """How a runner's ranks ended. ``failures[0]`` is the first failure here, if any."""

    state: str  # "succeeded" | "failed" | "stopped" | "timeout"
    exit_codes: list[int | None]
    failures: list[RankFailure]
    stopped_at: float | None  # time.time() once every rank was reaped after a stop; None if they all exited


def ended_on_its_own(code: int | None) -> bool:
    """Did a process that was sent the stop's signals (SIGTERM, then SIGKILL) end with a failure of its own?

    One that dies of them ends with ``-SIGTERM`` or ``-SIGKILL``; one that was already exiting when they came
    (the kernel ignores signals to a process in its exit) keeps its own code: ``os._exit(9)`` is 9.
    """
    return code not in (None, 0, -signal.SIGTERM, -signal.SIGKILL)


def failure_order(report: dict) -> tuple:
    """Sort key of failure reports (dicts) from one machine: genuine before collateral, then earliest."""
    return (bool(report.get("collateral")), report.get("failed_at_boot") or 0.0)


OutputFn = Callable[[int, str, str], None]  # (rank, "stdout" | "stderr", line)
FailureFn = Callable[[RankFailure], None]
SplitFn = Callable[[RankCommand, str], tuple[int, str]]


class RankRunner:
    """Start ``commands``, watch them, stop all of them on the first failure; see the module docstring.

    >>> runner = RankRunner([RankCommand((0,), ("-c", "print(1)"), dict(os.environ))], on_output=print)
    >>> runner.run().state
    'succeeded'

    ``on_output(rank, stream, line)`` gets every line (``capture=False`` lets
    the ranks write to this process's stdout/stderr instead);
    ``on_failure(report)`` is called once, at the first failure, before the
    other ranks are stopped (the gang agent tells the other machines from it).
    ``template`` is the warm template to fork from (None: fresh interpreters).
    """

    def __init__(self, commands: Sequence[RankCommand], *, on_output: OutputFn | None = None,
                 on_failure: FailureFn | None = None, template=None, capture: bool = True,
                 split_line: SplitFn | None = None, grace: float = FAIL_GRACE, tail_lines: int = TAIL_LINES):
        self.commands = list(commands)
        self.on_output = on_output
        self.on_failure = on_failure
        self.template = template
        self.capture = capture
        self.split_line = split_line
        self.grace = grace
        self.procs: list = []  # Popen or WarmProcess, one per command
        self.warm: list[bool] = []
        self.started_at: float | None = None
        self.tails: dict[int, collections.deque] = {r: collections.deque(maxlen=tail_lines)
                                                     for c in self.commands for r in c.ranks}
        self._tail_lines = tail_lines
        self._pumps: list[threading.Thread] = []
        self._wake = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._ending: str | None = None  # "failure" or "stop": who ends the run
        self._stop_grace = grace
        self._outcome: RunOutcome | None = None
        # An abstract socket (Linux): no file, so no path-length limit under a deep TMPDIR and nothing to remove.
        self._address = f"@gpulayer-ranks-{os.getpid()}-{uuid.uuid4().hex}"
        self._inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._inbox.bind(_sockaddr(self._address))
        self._reports: dict[int, dict] = {}  # rank -> its failure report
        self._closing = False
        self._watcher: threading.Thread | None = None

    # -- public ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every rank (warm where possible), then watch them in a thread."""
        threading.Thread(target=self._listen, name="gpulayer-rank-reports", daemon=True).start()
        try:
            for command in self.commands:
                self._start_one(command)
        except BaseException:
            stop_group(self.procs, grace=0)
            self._cleanup()
            raise
        self.started_at = time.time()
        if not self.procs:
            self._wake.set()
        self._watcher = threading.Thread(target=self._watch, name="gpulayer-rank-runner", daemon=True)
        self._watcher.start()

    def wait(self, timeout: float | None = None) -> RunOutcome | None:
        """The outcome once every rank has ended (or was stopped); None if still running after ``timeout``."""
        if not self._done.wait(timeout):
            return None
        return self._outcome

    def stop(self, grace: float = 0.5, reason: str = "stop") -> RunOutcome:
        """Stop every rank (SIGTERM, SIGKILL after ``grace``); returns the outcome. Safe from any thread.

        If a failure is already being handled, waits for its outcome instead.
        """
        if self._watcher is None:  # never started (or start failed): nothing is watched, nothing to wait for
            stop_group(self.procs, grace=grace)
            return RunOutcome("stopped", [p.poll() for p in self.procs], [], time.time())
        with self._lock:
            if self._ending is None:
                self._ending, self._stop_grace = reason, grace
        self._wake.set()
        self._done.wait()
        return self._outcome

    def run(self, timeout: float | None = None) -> RunOutcome:
        """``start``, wait; after ``timeout`` seconds stop everything (state ``"timeout"``)."""
        self.start()
        outcome = self.wait(timeout)
        return outcome if outcome is not None else self.stop(self.grace, reason="timeout")

    # -- starting ------------------------------------------------------------------------------------
    def _start_one(self, command: RankCommand) -> None:
        env = dict(command.env, **{REPORTS_ENV: self._address})
        if self.capture:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
        else:
            out_w, err_w = 1, 2
        warm = bool(command.warm and self.template is not None and self.template.wait_ready())
        try:
            proc = None
            if warm:
                try:
                    proc = self.template.spawn(list(command.argv), env, command.cwd, out_w, err_w)
                except RuntimeError as err:  # the template died under us: this rank starts fresh
                    print(f"gpulayer: {err}; starting rank {command.ranks[0]} as a fresh interpreter",
                          file=sys.stderr)
                    warm = False
            if proc is None:
                # Own process group (a stop reaches the rank's children), and dead with this process.
                proc = subprocess.Popen([sys.executable, *command.argv], env=env, cwd=command.cwd,
                                        stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                                        start_new_session=True, preexec_fn=die_with_parent)
        finally:
            if self.capture:
                os.close(out_w)
                os.close(err_w)
        self.procs.append(proc)
        self.warm.append(warm)
        if warm:
            proc.add_exit_callback(self._wake.set)
        else:
            threading.Thread(target=self._reap, args=(proc,), daemon=True, name="gpulayer-rank-wait").start()
        if self.capture:
            for stream, fd in (("stdout", out_r), ("stderr", err_r)):
                t = threading.Thread(target=self._pump, args=(command, stream, fd), daemon=True,
                                     name="gpulayer-rank-output")
                t.start()
                self._pumps.append(t)

    def _listen(self) -> None:
        """Failure reports from the ranks, as they are sent (before the rank has exited)."""
        while True:
            try:
                data = self._inbox.recv(MAX_REPORT + 4096)
            except OSError:
                return
            if not data:
                if self._closing:
                    return
                continue
            try:
                report = json.loads(data)
                self._reports.setdefault(int(report["rank"]), report)
            except (ValueError, KeyError, TypeError):
                continue
            self._wake.set()

    def _reap(self, proc: subprocess.Popen) -> None:
        proc.wait()
        self._wake.set()

    def _pump(self, command: RankCommand, stream: str, fd: int) -> None:
        with open(fd, "rb", closefd=True) as pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                rank = command.ranks[0]
                if self.split_line is not None:
                    rank, line = self.split_line(command, line)
                if stream == "stderr":
                    self.tails.setdefault(rank, collections.deque(maxlen=self._tail_lines)).append(line)
                if self.on_output is not None:
                    try:
                        self.on_output(rank, stream, line)
                    except Exception:
                        pass

    # -- watching --------------------------------------------------------------------------------------
    def _watch(self) -> None:
        try:
            self._outcome = self._watch_loop()
        except BaseException as err:  # never leave a waiter hanging, never leave a rank running
            stop_group(self.procs, grace=0)
            self._outcome = RunOutcome("failed", [p.poll() for p in self.procs],
                                       [RankFailure(self.commands[0].ranks[0], "exception", type=type(err).__name__,
                                                    message=f"the rank runner failed: {err}")], time.time())
        finally:
            self._cleanup()
            self._done.set()

    def _watch_loop(self) -> RunOutcome:
        while True:
            self._wake.wait()
            self._wake.clear()
            seen_at, seen_at_boot = time.time(), boot_clock()
            failed = {i for i, (c, p) in enumerate(zip(self.commands, self.procs))
                      if p.poll() not in (None, 0) or any(r in self._reports for r in c.ranks)}
            if failed or self._ending is not None:
                # A rank that died on its own (its exit not seen yet) just before another rank lost it, or before
                # a peer's failure reached us, is a failure, not one we stop: it may be the one to name.
                # Only ranks that lost a peer so far: the peer, if it is one of ours, is still ending.
                lost_peer_only = bool(failed) and all(
                    any((self._reports.get(r) or {}).get("collateral") for r in self.commands[i].ranks) for i in failed)
                failed |= {i for i, code in ended_unseen(self.procs, settle=SETTLE if lost_peer_only else 0.0).items()
                           if code != 0}
            with self._lock:
                if self._ending is None and failed:
                    self._ending = "failure"
                ending = self._ending
            if ending == "failure":
                return self._fail(failed, seen_at, seen_at_boot)
            if ending is not None:
                dated = self._stop(failed, seen_at, seen_at_boot, self._stop_grace)
                stopped_at = time.time()
                self._drain()
                state = "timeout" if ending == "timeout" else "stopped"
                return RunOutcome(state, [p.poll() for p in self.procs], self._failures(dated), stopped_at)
            if all(p.poll() == 0 for p in self.procs):
                self._drain()
                return RunOutcome("succeeded", [0] * len(self.procs), [], None)

    def _fail(self, failed: set[int], seen_at: float, seen_at_boot: float) -> RunOutcome:
        dated = dict.fromkeys(failed, (seen_at, seen_at_boot))
        first = self._failures(dated, only_dated=True)[0]
        if self.on_failure is not None:
            try:
                self.on_failure(first)  # before stopping the others: other machines start stopping now
            except Exception:
                pass
        dated = self._stop(failed, seen_at, seen_at_boot, self.grace)
        stopped_at = time.time()
        self._drain()
        # Now with the reports of ranks that failed while we stopped them, and complete stderr tails.
        return RunOutcome("failed", [p.poll() for p in self.procs], self._failures(dated), stopped_at)

    def _stop(self, failed: set[int], seen_at: float, seen_at_boot: float,
              grace: float) -> dict[int, tuple[float, float]]:
        """Stop every rank; returns index -> (time, boot time) of the processes that ended on their own.

        Those are the ones in ``failed`` (dated when seen), those the kernel says ended before the stop's
        signals went out, and those that ended with a code of their own while we stopped them (dated when
        the stop began: they died before it reached them, so after every failure seen before it).
        """
        stop_at, stop_at_boot = time.time(), boot_clock()
        dated = dict.fromkeys(failed, (seen_at, seen_at_boot))
        for i in ended_unseen(self.procs, wait=0.0):  # its code may still be on its way: the stop reaps it
            dated.setdefault(i, (stop_at, stop_at_boot))
        stop_group(self.procs, grace=grace)
        for i, (command, proc) in enumerate(zip(self.commands, self.procs)):
            if command.dies_of_sigterm and ended_on_its_own(proc.poll()):
                dated.setdefault(i, (stop_at, stop_at_boot))
        return dated

    def _failures(self, dated: dict[int, tuple[float, float]], only_dated: bool = False) -> list[RankFailure]:
        """Failure reports, first failure first: every rank that reported one, and the processes in
        ``dated`` (seen ending on their own, with when) that died without a report."""
        out = []
        for i, (command, proc) in enumerate(zip(self.commands, self.procs)):
            code = proc.poll()
            if only_dated and i not in dated:
                continue
            reports = [dict(self._reports[r]) for r in command.ranks if r in self._reports]
            for r in reports:
                if r.get("exit_code") is None:
                    r["exit_code"] = code
            if not reports and i in dated and code != 0:  # dated when seen: it could say no more
                how = ("an exit code not known yet" if code is None else
                       f"killed by signal {-code}" if code < 0 else f"exit code {code}")
                failed_at, failed_at_boot = dated[i]
                reports = [{"rank": command.ranks[0], "kind": "exit", "exit_code": code,
                            "message": f"the process ended with {how} before reporting an error "
                                       "(out of memory? killed?)",
                            "failed_at": failed_at, "failed_at_boot": failed_at_boot, "host": socket.gethostname()}]
            out.extend(reports)
        out.sort(key=failure_order)
        return [RankFailure(**{k: r[k] for k in _FIELDS if r.get(k) is not None},
                            stderr_tail="\n".join(self.tails.get(r["rank"], ()))) for r in out]

    def _drain(self) -> None:
        """Let the output threads read what the ranks wrote before they ended (a grandchild may hold a pipe)."""
        deadline = Deadline(DRAIN_S)
        for t in self._pumps:
            t.join(deadline.remaining())

    def _cleanup(self) -> None:
        self._closing = True
        try:  # an empty datagram wakes the listener, which then ends
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(b"", _sockaddr(self._address))
        except OSError:
            pass
        self._inbox.close()


def ended_unseen(procs: Sequence, wait: float = 2.0, settle: float = 0.0) -> dict[int, int | None]:
    """Index -> exit code of the processes that have ended though ``poll()`` does not say so yet.

    A warm rank's exit reaches the runner through its template, milliseconds late; a stop sent in
    between would count a rank that died on its own (a SIGKILL, say) as one we stopped, and the
    gang's failure would name a rank that merely lost its connection to it. The kernel knows first:
    a process whose pidfd is readable, or that is gone, has ended; its code follows within ``wait``
    (None: it has ended, and its code is not known yet).
    ``settle``: when none has ended yet, wait this long for one to (a rank that lost its peer can
    report before the peer's exit is complete: its sockets close first).
    """
    if not hasattr(os, "pidfd_open"):
        return {}
    import select

    ended: set[int] = set()
    live: dict[int, int] = {}  # pidfd -> index
    try:
        for i, proc in enumerate(procs):
            if proc.poll() is not None:
                continue
            try:
                live[os.pidfd_open(proc.pid)] = i
            except ProcessLookupError:
                ended.add(i)  # reaped already: its code is on its way
            except OSError:
                continue
        if live:
            ready = select.select(list(live), [], [], 0)[0]
            if not ready and not ended and settle > 0:
                select.select(list(live), [], [], settle)
                ready = select.select(list(live), [], [], 0)[0]
            ended |= {live[fd] for fd in ready}
    finally:
        for fd in live:
            os.close(fd)
    out: dict[int, int | None] = {}
    deadline = Deadline(wait)
    for i in sorted(ended):
        try:
            out[i] = procs[i].wait(deadline.remaining())
        except subprocess.TimeoutExpired:
            out[i] = None  # ended all the same; the template (busy) tells its code later
    return out


_FIELDS = ("rank", "kind", "exit_code", "type", "message", "traceback", "exc_module", "exc_qualname", "exc_pack",
           "failed_at", "failed_at_boot", "collateral", "host")
