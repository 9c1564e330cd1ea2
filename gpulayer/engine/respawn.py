"""A pool process that died is replaced at once, so a killed job's slot serves again in milliseconds.

Two things kept a slot idle for 4-5 s after ``revoke(terminate=True)``, a cancel, a time limit or a
crash (measured by ``benchmarks/slot_back.py``), neither of them an import: the worker main process
imported torch before forking its pool, so a replacement starts with it.

- **The exit seen too early.** Celery's prefork pool replaces a process when its sentinel pipe becomes
  readable (``AsynPool._event_process_exit`` runs ``maintain_pool``). The pipe closes while the dying
  process closes its descriptors, a moment before the kernel has its exit status; billiard's reap
  (``Pool._join_exited_workers``, ``waitpid`` without blocking) then finds it alive and does nothing,
  and the replacement waits for the pool's next 5-second ``maintain_pool`` timer (``AsynPool.timers``).
  Here, when the process is still in the pool after the event, the reap is tried again a few
  milliseconds later, doubling up to about a second (then the timer's turn).
- **A full garbage collection before each fork.** ``AsynPool._create_worker_process`` calls
  ``gc.collect()`` first; over a heap holding torch that is 0.3-1 s on a busy 2-core machine.
  :func:`freeze_heap` moves everything the worker has built by the time its pool starts (the imports,
  torch's among them) to the collector's permanent generation (``gc.freeze``), so that collection
  walks only what was made since. Objects still referenced are freed as before when their count drops;
  only cyclic garbage among the frozen ones is never collected (there is none to speak of in
  imported modules), and no memory is added: the pool processes share the frozen pages longer (a
  collection no longer writes to them).

Patched in by :func:`install` (the worker, before it starts); pinned in ``engine/upstream.py``.
"""

from __future__ import annotations

import gc

from celery.concurrency import asynpool

from .upstream import patch

FIRST_RETRY = 0.002  # seconds after the exit event before the reap is tried again
LAST_RETRY = 1.0  # past this the pool's own 5-second timer takes over

_original = asynpool.AsynPool._event_process_exit


def _event_process_exit(self, hub, proc):
    """Celery's handler, then a retry soon if the process was not reaped yet (see the module docstring)."""
    _original(self, hub, proc)
    if proc in self._pool:
        _reap_later(self, hub, proc, FIRST_RETRY)


def _reap_later(pool, hub, proc, delay: float) -> None:
    def again():
        if proc not in pool._pool:  # reaped meanwhile (another exit's event, or the timer)
            return
        pool.maintain_pool()
        if proc in pool._pool and delay * 2 <= LAST_RETRY:
            _reap_later(pool, hub, proc, delay * 2)

    hub.call_later(delay, again)


def freeze_heap() -> None:
    """Move what exists now to the collector's permanent generation (see the module docstring)."""
    gc.collect()
    gc.freeze()


def install() -> None:
    """In the worker, once everything it preloads is imported and just before its pool starts."""
    patch(asynpool.AsynPool, "celery.concurrency.asynpool:AsynPool._event_process_exit", _event_process_exit)
    freeze_heap()
