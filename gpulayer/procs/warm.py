"""Warm starts: a rank template that has imported torch once and forks each rank on request.

A fresh interpreter spends seconds importing torch and gpulayer; a fork of a
process that already has them takes milliseconds. The template is a fork
server, like ``multiprocessing``'s forkserver: a process started with this
process's environment (``python -m gpulayer.procs.warm``) that imports Python,
torch, gpulayer and the modules named in ``GPULAYER_PRELOAD`` (comma
separated), never initialises CUDA, starts no thread, and then waits on a unix
socket. For each request (argv, environment, cwd, and the rank's stdout/stderr
passed as file descriptors with ``socket.send_fds``) it forks; the child turns
itself into what a fresh ``python <argv>`` would be:

- its own session and process group (``setsid``), dying with the template
  (``PR_SET_PDEATHSIG``; the template dies with the thread that started it);
- ``os.environ`` replaced wholesale, ``sys.path`` recomputed from the new
  ``PYTHONPATH``, the working directory changed, ``sys.argv`` and ``__main__``
  set as the interpreter sets them for ``-m mod``, ``-c code`` or ``script.py``;
- ``OMP_NUM_THREADS`` applied to torch (``torch.set_num_threads``: torch read
  it when the template imported it);
- Python's ``random``, NumPy's global generator and torch's CPU generator
  reseeded from ``os.urandom``, as a fresh process seeds them;
- signal handlers and the signal mask as a fresh interpreter has them, stdin
  on ``/dev/null``, stdout/stderr on the fds it was given.

What stays the template's: modules already imported (a rank's different
``PYTHONPATH`` only affects modules imported later), and ``str`` hash
randomisation (``PYTHONHASHSEED`` is read once per interpreter; all ranks of one
template share it).

The template reaps its children and reports each exit status over the socket
(a forked rank is not this process's child, so ``waitpid`` cannot be used
here); :class:`WarmProcess` looks like ``subprocess.Popen`` to the runner
(``pid``, ``poll``, ``wait``, ``returncode``). The template needs Linux
(``os.pidfd_open``); elsewhere, or with ``GPULAYER_WARM_RANKS=0``, ranks start
as fresh interpreters.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from ..deadline import Deadline
from .tempdir import remove_made_here

log = logging.getLogger(__name__)

WARM_ENV = "GPULAYER_WARM_RANKS"
PRELOAD_ENV = "GPULAYER_PRELOAD"
READY_TIMEOUT = 120.0  # seconds a template may take to import everything
SPAWN_TIMEOUT = 10.0
MAX_MESSAGE = 4 * 2**20
# Room in the template's command line for each rank's own (``ps`` and /proc/<pid>/cmdline show it).
CMDLINE_ROOM = 4096
# torch reads these when it is imported: the template imports it without them, each rank applies its own.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def warm_enabled() -> bool:
    """Warm starts are on unless ``GPULAYER_WARM_RANKS=0`` (or the platform cannot fork a template)."""
    return os.environ.get(WARM_ENV, "1").strip().lower() not in ("0", "false", "no", "off") and \
        hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


# -- the runner's side -----------------------------------------------------------------------------
class WarmProcess:
    """A rank forked by a template: the part of ``subprocess.Popen`` the runner and ``stop_group`` use."""

    def __init__(self, pid: int, args):
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._exited = threading.Event()
        self._watchers: list = []
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def add_exit_callback(self, fn) -> None:
        """Call ``fn()`` once the process has exited (at once if it already has)."""
        with self._lock:
            if not self._exited.is_set():
                self._watchers.append(fn)
                return
        fn()

    def _set_exit(self, code: int) -> None:
        with self._lock:
            if self._exited.is_set():
                return
            self.returncode = code
            self._exited.set()
            watchers, self._watchers = self._watchers, []
        for fn in watchers:
            fn()


class WarmTemplate:
    """One rank template (a fork server) and the thread that starts it, reads it and restarts it.

    >>> t = WarmTemplate(); t.start()
    >>> proc = t.spawn(["-c", "print('hi')"], dict(os.environ), os.getcwd(), 1, 2)
    >>> proc.wait()
    0
    >>> t.close()

    The thread that calls ``start`` does not matter: the template is started by
    the template's own thread, which lives as long as the template, so the
    parent-death signal ties the template to this process, not to a caller.
    """

    def __init__(self, env: dict[str, str] | None = None, restart: bool = True):
        base = dict(os.environ if env is None else env)
        for var in THREAD_VARS:
            base.pop(var, None)
        self._env = base
        self._restart = restart
        self._lock = threading.Lock()  # one spawn request in flight
        self._replies: queue.Queue = queue.Queue()
        self._procs: dict[int, WarmProcess] = {}
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._ready = threading.Event()
        self._gone = threading.Event()  # set when the template will not come (back)
        self._closed = False
        self._thread: threading.Thread | None = None
        self.pid: int | None = None
        self.failures = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "WarmTemplate":
        """Start the template in the background (returns at once); idempotent."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._keep, name="gpulayer-warm-template", daemon=True)
                self._thread.start()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> bool:
        """True once the template can fork ranks; False if it failed or did not get ready in time."""
        deadline = Deadline(timeout)
        while not self._ready.is_set():
            if self._gone.is_set() or deadline.expired():
                return False
            self._ready.wait(deadline.left(0.05))
        return True

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the template (its live ranks die with it) and its thread."""
        self._closed = True
        self._gone.set()
        sock, proc = self._sock, self._proc
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the template exits on end of file
            except OSError:
                pass
        if proc is not None:
            from .stop import stop

            # SIGKILL if it did not exit within ``timeout``; at once while it is still importing torch: it has
            # forked no rank yet, and would read the end of file only once the import is done (seconds, on a
            # `gpulayer down` right after `gpulayer up`).
            stop([proc], timeout if self._ready.is_set() else 0, term=None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- forking a rank ------------------------------------------------------------------------
    def spawn(self, argv: list[str], env: dict[str, str], cwd: str | None, stdout: int, stderr: int) -> WarmProcess:
        """Fork a rank running ``python <argv>`` with ``env`` in ``cwd``; its output goes to the given fds."""
        if not self.wait_ready():
            raise RuntimeError("the warm rank template is not running")
        request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd or os.getcwd()}).encode()
        if len(request) > MAX_MESSAGE:
            raise RuntimeError(f"a rank's environment and arguments take {len(request)} bytes, over {MAX_MESSAGE}")
        with self._lock:
            sock = self._sock
            if sock is None or not self._ready.is_set():
                raise RuntimeError("the warm rank template is not running")
            socket.send_fds(sock, [request], [stdout, stderr])
            try:
                reply = self._replies.get(timeout=SPAWN_TIMEOUT)
            except queue.Empty:
                raise RuntimeError(f"the warm rank template did not fork within {SPAWN_TIMEOUT:.0f} s") from None
        if isinstance(reply, Exception):
            raise reply
        return reply

    # -- the template's thread: start, read, restart ---------------------------------------------
    def _keep(self) -> None:
        from .stop import die_with_parent

        while not self._closed:
            while not self._replies.empty():  # stale answers from a template that died
                self._replies.get_nowait()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            started = time.monotonic()
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "gpulayer.procs.warm", str(theirs.fileno()), " " * CMDLINE_ROOM],
                    env=self._env,
                    stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), preexec_fn=die_with_parent)
            except OSError as err:
                log.warning("gpulayer: cannot start the warm rank template (%s); ranks start fresh", err)
                ours.close()
                theirs.close()
                break
            theirs.close()
            self.pid = self._proc.pid
            self._sock = ours
            self._read(ours)
            was_ready = self._ready.is_set()
            self._ready.clear()
            self._sock = None
            ours.close()
            code = self._proc.wait()
            self._reply_error(RuntimeError(f"the warm rank template exited (code {code})"))
            self._orphans_gone()
            if self._closed or not self._restart:
                break
            # A template that dies before it is ready (an import that crashes it, a thread or CUDA at
            # import) or soon after is not restarted in a loop.
            self.failures = self.failures + 1 if not was_ready or time.monotonic() - started < 5 else 0
            if self.failures >= 3:
                log.warning("gpulayer: the warm rank template died %d times at start; ranks start fresh",
                            self.failures)
                break
            log.warning("gpulayer: the warm rank template exited (code %s); starting a new one", code)
            time.sleep(1.0 * self.failures)
        self._gone.set()

    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(MAX_MESSAGE)
            except OSError:
                return
            if not data:
                return
            msg = json.loads(data)
            if "ready" in msg:
                self._ready.set()
            elif "pid" in msg:
                proc = WarmProcess(msg["pid"], msg.get("argv"))
                self._procs[proc.pid] = proc
                self._replies.put(proc)
            elif "exit" in msg:
                proc = self._procs.pop(msg["exit"], None)
                if proc is not None:
                    proc._set_exit(msg["code"])
            elif "error" in msg:
                self._replies.put(RuntimeError(f"the warm rank template could not fork: {msg['error']}"))

    def _reply_error(self, err: Exception) -> None:
        if self._lock.locked():  # a spawn is waiting for a reply that will not come
            self._replies.put(err)

    def _orphans_gone(self) -> None:
        """The template died: its ranks die with it (parent-death signal); report them killed once gone."""
        procs, self._procs = self._procs, {}
        for proc in procs.values():
            try:
                fd = os.pidfd_open(proc.pid)
            except OSError:
                proc._set_exit(-signal.SIGKILL)
                continue
            try:
                select.select([fd], [], [], 5.0)
            finally:
                os.close(fd)
            proc._set_exit(-signal.SIGKILL)


_shared: WarmTemplate | None = None
_shared_lock = threading.Lock()


def shared_template(start: bool = True) -> WarmTemplate | None:
    """This process's long-lived template (the worker's), started lazily in the background; None if off."""
    global _shared
    if not warm_enabled():
        return None
    with _shared_lock:
        if _shared is None and start:
            _shared = WarmTemplate().start()
        return _shared


def close_shared_template() -> None:
    global _shared
    with _shared_lock:
        template, _shared = _shared, None
    if template is not None:
        template.close()


# -- the template's side -------------------------------------------------------------------------------
def _fresh_signals() -> dict:
    """The signal dispositions of this interpreter now, at start: what a fresh one has."""
    out = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            out[sig] = signal.getsignal(sig)
        except (OSError, ValueError):
            pass
    return out


def _preload() -> None:
    import importlib

    names = ["torch", "gpulayer", "gpulayer.gang.rank", "gpulayer.trainer.launcher"]
    names += [n.strip() for n in os.environ.get(PRELOAD_ENV, "").split(",") if n.strip()]
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except ImportError as err:  # a rank that needs it fails on its own import, as a fresh one would
            if name != "torch":
                print(f"gpulayer warm template: cannot preload {name}: {err}", file=sys.stderr, flush=True)
    if "numpy" in sys.modules:  # torch's import brings numpy, whose random module each rank reseeds (_reseed)
        importlib.import_module("numpy.random")


def _serve(sock: socket.socket) -> dict | None:
    """Fork on each request; reap the children. Returns only in a forked child, with its request."""
    children: dict[int, int] = {}  # pidfd -> pid
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd != sock.fileno():
                pid = children.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
                continue
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
            if not data:
                return None  # the runner went away (or closed us): the ranks die with us
            request = json.loads(data)
            try:
                pid = os.fork()
            except OSError as err:
                for f in fds:
                    os.close(f)
                sock.send(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())
                continue
            if pid == 0:
                request["fds"] = fds
                request["inherited"] = [sock.fileno(), *children]
                return request
            for f in fds:
                os.close(f)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
            sock.send(json.dumps({"pid": pid, "argv": request["argv"]}).encode())


def _become_rank(request: dict, fresh_signals: dict, base_path: list[str], template_pid: int) -> int:
    """In the forked child: become what ``python <argv>`` started fresh would be, then run it."""
    from .stop import die_with_parent

    os.setsid()
    die_with_parent()
    if os.getppid() != template_pid:  # the template died between fork and prctl
        os._exit(1)
    for fd in request["inherited"]:
        os.close(fd)
    # Signals: a fresh interpreter's handlers, nothing blocked.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig, handler in fresh_signals.items():
        try:
            if signal.getsignal(sig) != handler and handler is not None:
                signal.signal(sig, handler)
        except (OSError, ValueError):
            pass
    # Standard streams: stdin closed (/dev/null), stdout/stderr where the runner said.
    out_fd, err_fd = request["fds"][:2]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in set(request["fds"]) - {0, 1, 2}:
        os.close(fd)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    _reopen_stdio(env)
    argv = request["argv"]
    _set_cmdline([sys.executable, *argv])
    sys.path[:] = _fresh_path(argv, env, base_path)
    _reseed()
    _apply_threads(env)
    return _run_argv(argv)


def _set_cmdline(args: list[str]) -> None:
    """Write the rank's command line where the kernel reads /proc/self/cmdline (the template's argv area)."""
    import ctypes

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5): arg_start, arg_end
    except (OSError, ValueError, IndexError):
        return
    size = end - start
    if size <= 1:
        return
    data = b"\0".join(os.fsencode(a) for a in args)[:size - 1]
    ctypes.memmove(start, data + b"\0" * (size - len(data)), size)


def _reopen_stdio(env: dict[str, str]) -> None:
    import io

    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = env.get("PYTHONIOENCODING", "").partition(":")[0] or "utf-8"
    streams = {}
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        tty = os.isatty(fd)
        mode = "rb" if fd == 0 else "wb"
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = raw if (unbuffered and fd) else (io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw))
        streams[name] = io.TextIOWrapper(buffered, encoding=encoding,
                                         errors="backslashreplace" if fd == 2 else "strict",
                                         line_buffering=(tty or fd == 2) and not unbuffered,
                                         write_through=unbuffered and fd != 0)
    sys.stdin, sys.stdout, sys.stderr = streams["stdin"], streams["stdout"], streams["stderr"]
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _fresh_path(argv: list[str], env: dict[str, str], base_path: list[str]) -> list[str]:
    """``sys.path`` as a fresh interpreter computes it: argv's directory, PYTHONPATH, then site's."""
    if argv and argv[0] == "-m":
        first = os.getcwd()
    elif argv and argv[0] == "-c":
        first = ""
    else:
        first = os.path.dirname(os.path.realpath(argv[0])) if argv else ""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return list(dict.fromkeys([first, *[os.path.abspath(p) for p in extra], *base_path]))


def _reseed() -> None:
    """Fresh generators: a fork would share the template's streams (Python's ``random`` reseeds itself)."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()  # the legacy global RandomState, seeded from the OS as at import
        except Exception:
            pass
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):
        torch.default_generator.seed()  # torch seeds it non-deterministically in each fresh process


def _apply_threads(env: dict[str, str]) -> None:
    torch = sys.modules.get("torch")
    value = env.get("OMP_NUM_THREADS", "")
    if torch is not None and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def _run_argv(argv: list[str]) -> int:
    """Run ``python <argv>``'s target as ``__main__``; an exception propagates as it would at top level."""
    import runpy
    import types

    if argv and argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0], as ``-m`` does
        # A fresh ``python -m`` has not imported its module yet; the template may have (a preload): run it
        # fresh, without runpy's "found in sys.modules" RuntimeWarning on every rank's stderr.
        sys.modules.pop(argv[1], None)
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv and argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def main(argv: list[str]) -> int:
    fresh_signals = _fresh_signals()
    sock = socket.socket(fileno=int(argv[0]))
    pythonpath = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in pythonpath]
    _preload()
    sys.stdout.flush()
    sys.stderr.flush()
    threads = threading.active_count()
    if threads != 1:  # a fork copies only the forking thread: refuse rather than hand out broken ranks
        print(f"gpulayer warm template: {threads} Python threads after preloading; not forking",
              file=sys.stderr, flush=True)
        return 1
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # CUDA does not survive a fork
        print("gpulayer warm template: a preloaded module initialised CUDA; not forking", file=sys.stderr,
              flush=True)
        return 1
    # What the template imported goes to the collector's permanent generation: a full collection in a rank
    # then walks only the rank's own objects (0.1-0.2 s and as many page copies less over torch's heap).
    gc.collect()
    gc.freeze()
    template_pid = os.getpid()
    sock.send(json.dumps({"ready": True}).encode())
    request = _serve(sock)
    if request is None:  # its worker closed it: nothing to finish, and tearing torch down takes a while
        sys.stdout.flush()
        sys.stderr.flush()
        remove_made_here()
        os._exit(0)
    return _become_rank(request, fresh_signals, base_path, template_pid)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
