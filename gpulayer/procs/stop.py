"""Stopping processes: the one stopper, the one parent-death hook, a process tree's kill.

``stop_group`` stops ranks (and anything else started in a session of its own): SIGTERM, a grace,
then SIGKILL, descendants that left the group included. ``kill_tree`` is the immediate form for a
job's pool process and everything under it. ``die_with_parent`` ties a child to the thread that
started it (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil


def stop_group(procs: list[subprocess.Popen], grace: float = 0.5) -> None:
    """Stop process groups started with ``start_new_session``: SIGTERM, SIGKILL after ``grace`` s; reap all.

    The one process stopper for ranks; ``procs`` may also be warm ranks (``warm.WarmProcess``).
    Descendants that left the group are signalled too, by pid: torchrun starts each rank in a
    session of its own, so a torchrun killed before it stopped them would leave them running.
    """
    strays = _strays(procs, {})
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    for q in strays.values():
        _signal(q, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    strays = _strays(procs, strays)
    for p in procs:
        _signal_group(p, signal.SIGKILL)  # also reaches grandchildren still in the group
    for q in strays.values():
        _signal(q, signal.SIGKILL)
    for p in procs:
        p.wait()


def _strays(procs: list, known: dict) -> dict:
    """``known`` plus the live descendants of ``procs`` outside their process groups, by pid."""
    out = dict(known)
    for p in procs:
        try:
            for q in psutil.Process(p.pid).children(recursive=True):
                if q.pid not in out and os.getpgid(q.pid) != p.pid:
                    out[q.pid] = q
        except (psutil.Error, OSError):
            pass
    return out


def _signal(q, sig: int) -> None:
    """Signal one process found by ``psutil`` (which checks it is still the same process, not a reused pid)."""
    try:
        q.send_signal(sig)
    except psutil.Error:
        pass


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before exec, or after a fork (Linux): get ``sig`` when the thread that started it dies.

    The one parent-death mechanism: ranks, the warm template, pool processes and local workers use it.
    """
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def kill_tree(pid: int) -> int:
    """SIGKILL ``pid`` and all its descendants; returns how many processes were signalled."""
    try:
        root = psutil.Process(pid)
        # The job's own process first: killed after its children, it could see them exit, return, and
        # store a success for a job that was cancelled (seen under load with a job waiting on a child).
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return len(procs)
