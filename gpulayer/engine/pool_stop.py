"""A stopping worker's pool ends in milliseconds once its jobs are done, not 1.5 s later.

Celery's warm shutdown stops the prefork pool with ``TaskPool.on_stop``: close the pool, join it (billiard's
``Pool.join``: the worker handler, the task handler, which sends each pool process its end-of-work sentinel,
the result handler, which reads results until no job is left in the pool, then each process), while a
thread fires the event loop's timers and runs the acks that finished jobs queued. Two sleeps made that
1.5 s on an idle worker, which ``gpulayer down`` waited for (``benchmarks/cli_time.py``):

- each pool process, once it has left its loop, sleeps 1 s before it exits (billiard's ``Worker._do_exit``,
  so that its parent reads its last message first), and the join waits for it;
- the timer thread sleeps 0.5 s between its passes whatever happens, and ``on_stop`` waits out the sleep it
  is in when the join returns.

Here the join is billiard's in the same order, but once the result handler has returned, no job is left in
the pool: every job handed to a process came back (its result and its ack went the usual way) or its
process is gone (a job lost with its process, as before). What a process still does then is exit, so
the processes are killed (``procs.stop``, SIGKILL without a grace; what a job started and left running
under one is left alone, as billiard's exit leaves it) and reaped at once. The timer thread waits on an event between its passes, so it ends when the join does.
Nothing else changes: the acks queued during the join run once more after it, as Celery runs them.

A job still running at ``gpulayer down`` is waited for as before (the result handler reads until it is
done); one the supervisor kills after its grace leaves its message unacknowledged, handed back by the
worker's next life or the janitor (at least once). Patched in by :func:`install`; pinned in
``engine/upstream.py``.
"""

from __future__ import annotations

import logging
import threading

import psutil
from billiard.pool import CLOSE, RUN, stop_if_not_current
from celery.concurrency import prefork
from kombu.asynchronous import get_event_loop

from ..procs.stop import stop
from .upstream import patch

log = logging.getLogger(__name__)

TIMER_TURN = 0.5  # seconds between the timer thread's passes while the pool drains (Celery's)


def on_stop(self) -> None:
    """``TaskPool.on_stop``: close the pool and end it at once once it has drained (see the module docstring)."""
    pool = self._pool
    if pool is None or pool._state not in (RUN, CLOSE):
        return
    pool.close()
    hub = get_event_loop()
    timers = _TimerThread(hub) if hub is not None else None
    try:
        join_at_once(pool)
    finally:
        if timers is not None:
            timers.stop()
    self._pool = None


def join_at_once(pool) -> None:
    """billiard's ``Pool.join`` for a closed pool, with its processes killed once no job is left in them."""
    stop_if_not_current(pool._worker_handler)  # no process is started any more
    pool._stop_task_handler(pool._task_handler)  # each process gets its end-of-work sentinel
    stop_if_not_current(pool._result_handler)  # returns once the jobs' results are in (or their processes gone)
    started = [p for p in pool._pool if p._popen is not None]
    stop([q for q in map(_process, started) if q is not None], 0, term=None, wait=False)
    for p in started:
        p.join()  # reaps it


def _process(p) -> psutil.Process | None:
    """A pool process that has not exited yet, to signal (psutil checks its pid is still that process)."""
    if p.exitcode is not None:
        return None
    try:
        return psutil.Process(p.pid)
    except psutil.NoSuchProcess:
        return None


class _TimerThread:
    """The event loop's timers and queued acks, fired every ``TIMER_TURN`` s until :meth:`stop`, then the acks
    queued since its last pass (as Celery's ``on_stop`` does)."""

    def __init__(self, hub):
        self.hub = hub
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="gpulayer-pool-stop-timers")
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                self.hub.fire_timers()
                prefork._run_ready_callbacks(self.hub)
            except Exception:  # noqa: BLE001  (as Celery: logged, the drain goes on)
                log.warning("gpulayer: firing timers while the pool stops failed", exc_info=True)
            self.done.wait(TIMER_TURN)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=1.0)
        if self.thread.is_alive():  # stuck in a timer: its acks stay for the hub's close
            log.warning("gpulayer: the pool's timer thread did not end")
            return
        try:
            prefork._run_ready_callbacks(self.hub)
        except Exception:  # noqa: BLE001
            log.warning("gpulayer: running the acks queued while the pool stopped failed", exc_info=True)


def install() -> None:
    """In the worker, before it starts."""
    patch(prefork.TaskPool, "celery.concurrency.prefork:TaskPool.on_stop", on_stop)
