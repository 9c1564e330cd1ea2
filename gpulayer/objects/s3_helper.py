"""obstore and ``fork()``: the rules that keep S3 usable in every process of a worker, and the helper process that
makes them hold.

obstore runs its requests on a Tokio runtime: threads started the first time a process uses it. ``fork()`` copies
only the calling thread, so a child forked after its parent used obstore hangs at its first request (obstore
does not detect it: developmentseed/obstore#441). A worker's main process forks all along (pool processes after
the preload, a replacement for a killed one, a fresh one per CUDA job), so:

- the worker's main process calls ``forking_process()`` at its start: its own S3 requests (the object sweep's
  listings and deletes, a janitor releasing a dead job's objects) go to a helper, ``python -m
  gpulayer.objects.s3``, started on first use and tied to it (``die_with_parent``), one JSON line per
  request; obstore never starts in the main process, and every child forked from it can use it;
- a process forked after obstore started in its parent gets ``ObjectStoreUnavailable`` naming the cause and the
  fix (the spawn start method) instead of hanging.

The helper moves no object bytes: only what the sweep needs (list, delete, exists, size).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from ..errors import ConfigError, ObjectStoreUnavailable

_forking = False  # this process forks children: its S3 requests go to the helper
_started_in: int | None = None  # the pid whose obstore runtime is running in this process's memory
_forked_from: int | None = None  # set in a child forked after its parent started obstore
_helper: Helper | None = None
_helper_lock = threading.Lock()
OPS = ("check", "list_old", "delete", "exists", "size")
HELPER_MODULE = "gpulayer.objects.s3"  # run as a program, it serves this module's requests with its S3 class


def forking_process() -> None:
    """Declare that this process forks children after its start (the worker's main process)."""
    global _forking
    _forking = True


def delegated() -> bool:
    """True where S3 requests go to the helper (a forking process)."""
    return _forking


def starting_obstore() -> None:
    """Before this process's first obstore request: note it, or refuse in a child of a process that used it."""
    global _started_in
    if _forked_from is not None:
        raise ObjectStoreUnavailable(
            f"this process ({os.getpid()}) was forked from process {_forked_from} after that one had used the S3 "
            "object store, and obstore's runtime does not survive a fork (its threads are not copied); start "
            "this process with multiprocessing's 'spawn' or 'forkserver' method, or use S3 only after the fork")
    _started_in = os.getpid()


def _after_fork_in_child() -> None:
    global _forking, _helper, _forked_from
    if _started_in is not None:
        _forked_from = _started_in
    _forking = False  # a pool process is not a forking process; its parent's helper is not its own
    _helper = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def helper() -> Helper:
    global _helper
    with _helper_lock:
        if _helper is None or _helper.proc.poll() is not None:
            _helper = Helper()
        return _helper


class Helper:
    """The helper process: ``call(op, url, *args)`` -> its answer, or the error it raised, raised here."""

    def __init__(self):
        from ..procs.stop import die_with_parent

        self.proc = subprocess.Popen([sys.executable, "-m", HELPER_MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, preexec_fn=die_with_parent)
        self.lock = threading.Lock()

    def call(self, op: str, url: str, *args):
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps([op, url, *args]) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except OSError:
                line = ""
        if not line:
            raise ObjectStoreUnavailable(f"the S3 helper process (pid {self.proc.pid}) exited "
                                         f"({self.proc.poll()}) before answering {op} for {url}; the next request "
                                         "starts a new one")
        answer = json.loads(line)
        if "error" in answer:
            raise _error(answer["error"], answer["message"])
        return answer["ok"]


def _error(kind: str, message: str) -> Exception:
    return {"ConfigError": ConfigError, "FileNotFoundError": FileNotFoundError}.get(
        kind, ObjectStoreUnavailable)(message)


def serve(make_store, lines=sys.stdin, out=sys.stdout) -> None:
    """The helper's loop: one request per line until its parent closes the pipe; ``make_store(url)`` gives the
    backend (s3.py's ``S3``, handed in: this module sits below it)."""
    stores: dict = {}
    for line in lines:
        op, url, *args = json.loads(line)
        try:
            if op not in OPS:
                raise ValueError(f"unknown request {op!r}")
            store = stores.get(url) or stores.setdefault(url, make_store(url))
            value = None if op == "check" else getattr(store, op)(*args)
            answer = {"ok": list(value) if op == "list_old" else value}
        except Exception as err:
            answer = {"error": type(err).__name__, "message": str(err)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
