"""Stopping processes: the one stopper and the one parent-death hook.

``stop`` is the only place gpulayer sends SIGTERM or SIGKILL to processes it started. Its variants
are parameters, and the usual ones have names:

- ``stop_group``: ranks (each a process group of its own): SIGTERM to the groups, a grace, SIGKILL,
  descendants that left their group included.
- ``stop_process``: one process (Redis, a worker, a supervisor): SIGTERM, a grace, SIGKILL.
- ``kill_now``: SIGKILL processes and everything under them at once, and wait until all are gone.
- ``kill_tree``: the same for one pid without waiting (a job's pool process, from the worker's reaper).

``die_with_parent`` ties a child to the thread that started it (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess

import psutil

from ..deadline import Deadline, poll

GONE_WAIT = 5.0  # seconds to wait for SIGKILLed processes that are not our children (their parent reaps them)


def stop(procs: list, grace: float = 0.5, *, term: int | None = signal.SIGTERM, groups: bool = False,
         tree: bool = False, wait: bool = True) -> int:
    """Stop ``procs``: ``term``, up to ``grace`` s for them to exit, then SIGKILL; returns how many were signalled.

    ``procs``: ``subprocess.Popen`` (or ``warm.WarmProcess``) objects, or ``psutil.Process`` for one that
    need not be our child. ``term``: the polite signal, or None when they were asked another way (their
    input closed) or are to be killed at once (``grace=0``). ``groups``: each leads a process group
    (``start_new_session``): signal the group, and the descendants that left it by pid (torchrun starts
    each rank in a session of its own, so a torchrun killed before it stopped them would leave them
    running). ``tree``: every descendant too, by pid. ``wait``: return once all are gone (our children
    reaped; others gone or zombies, for up to ``GONE_WAIT`` s).
    """
    others = _descendants(procs, {}, groups, tree)
    if term is not None:
        _send(procs, others, term, groups)
    if grace > 0 or term is not None:
        deadline = Deadline(grace)
        for p in procs:
            _wait(p, deadline.remaining())
        others = _descendants(procs, others, groups, tree)
    _send(procs, others, signal.SIGKILL, groups)  # a group's signal also reaches grandchildren still in it
    if wait:
        for p in procs:
            _wait(p, None if _ours(p) else GONE_WAIT)
        poll(lambda: not any(_running(q) for q in others.values()), GONE_WAIT, every=0.01)
    return len(procs) + len(others)


def stop_group(procs: list, grace: float = 0.5) -> None:
    """Stop ranks started with ``start_new_session``: SIGTERM to their groups, SIGKILL after ``grace`` s; reap all.

    ``procs`` may also be warm ranks (``warm.WarmProcess``).
    """
    stop(procs, grace, groups=True)


def stop_process(proc, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; always reaps."""
    stop([proc], grace)


def kill_now(procs: list) -> None:
    """SIGKILL ``procs`` (None and finished ones skipped) and every process under them at once; wait until all are gone.

    For what holds nothing worth a graceful shutdown (a process-scoped cluster: its data is thrown away).
    """
    stop([p for p in procs if p is not None and p.poll() is None], 0, term=None, tree=True)


def kill_tree(pid: int) -> int:
    """SIGKILL ``pid`` and all its descendants without waiting; returns how many processes were signalled.

    The job's own process goes first: killed after its children, it could see them exit, return, and
    store a success for a job that was cancelled (seen under load with a job waiting on a child).
    """
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    return stop([root], 0, term=None, tree=True, wait=False)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before exec, or after a fork (Linux): get ``sig`` when the thread that started it dies.

    The one parent-death mechanism: ranks, the warm template, pool processes and local workers use it
    (``functools.partial(die_with_parent, signal.SIGTERM)`` for a clean stop).
    """
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# -- the parts -----------------------------------------------------------------------------------------
def _descendants(procs: list, known: dict, groups: bool, tree: bool) -> dict:
    """``known`` plus the live descendants of ``procs`` to signal by pid: all of them with ``tree``, those
    outside their process group with ``groups``."""
    out = dict(known)
    if not (groups or tree):
        return out
    for p in procs:
        try:
            for q in _as_psutil(p).children(recursive=True):
                if q.pid not in out and (tree or os.getpgid(q.pid) != p.pid):
                    out[q.pid] = q
        except (psutil.Error, OSError):
            pass
    return out


def _send(procs: list, others: dict, sig: int, groups: bool) -> None:
    for p in procs:  # each process before its descendants
        try:
            if groups:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)  # Popen: not once reaped; psutil: not to a reused pid
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    for q in others.values():
        try:
            q.send_signal(sig)
        except psutil.Error:
            pass


def _wait(p, timeout: float | None) -> None:
    """Until ``p`` has exited (reaped if it is our child), or ``timeout`` s."""
    if _ours(p):
        if timeout is not None:
            _exited(p, timeout)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    else:  # maybe not our child: gone, or a zombie its parent has yet to reap
        poll(lambda: not _running(p), timeout, every=0.01)


def _exited(p, timeout: float) -> None:
    """Sleep until ``p`` exits or ``timeout`` s pass, woken by its pidfd (Linux 5.3+) the moment it exits:
    ``Popen.wait`` with a timeout polls, at up to 50 ms, which a stop of several stages (``gpulayer down``:
    the workers, then Redis) waited out at each. Elsewhere, or once it is reaped, nothing (``wait`` polls)."""
    if p.poll() is not None or not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(p.pid)
    except OSError:  # gone, or no pidfds here
        return
    try:
        select.select([fd], [], [], max(0.0, timeout))
    finally:
        os.close(fd)


def _ours(p) -> bool:
    return not isinstance(p, psutil.Process)


def _as_psutil(p) -> psutil.Process:
    return p if isinstance(p, psutil.Process) else psutil.Process(p.pid)


def _running(q: psutil.Process) -> bool:
    try:
        return q.is_running() and q.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
