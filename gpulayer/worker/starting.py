"""A worker's start: it answers Celery's control first, and preloads torch after.

1. **Registered.** Marked starting in the registry (``Registry.mark_starting``), then registered with its
   first heartbeat, before it imports Celery's worker machinery: jobs routed to it wait in its queues, and
   a broadcast meant for it waits until it answers (``engine/broadcast.py``) instead of missing it.
2. **Answering.** Once Celery's consumer runs (``worker_ready``), the worker casts a control command to itself
   through the broker (``engine/broadcast.py`` ``HEARD``, as ``celery control`` would, without a reply) until
   its event loop hears it: it is subscribed to the control broadcasts then. The cast goes through a
   connection of its own, closed after, and asks no reply (a reply would go out through Celery's producer
   pool, whose connections stay open): a worker holds no connection for its start (tests/test_connections.py).
   It clears its mark and tells whoever started it (``procs/ready.py`` ``CONSUMING``):
   ``gpulayer up`` returns then, and every command a user sends next is answered by every worker.
3. **Preloaded.** torch (``GPULAYER_PRELOAD``) is imported in the main process in the background, while the
   worker already takes jobs; then the pool is restarted (billiard's ``restart``: each pool process exits
   between two jobs, never during one, and is replaced by a fork of the main process, which has torch now).
   Importing torch took a second of the worker's start before any of it answered.

While torch is half imported, no pool process is forked (``os.register_at_fork``): a child would inherit
the import's lock held by a thread it does not have, and hang at its first ``import torch``.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time

from ..engine import broadcast
from ..procs import ready

log = logging.getLogger(__name__)

ANSWER_WAIT = 60.0  # seconds a worker casts to itself at most before it says it answers anyway (and logs why)
PING_TIMEOUTS = (0.05, 0.1, 0.2, 0.5)  # each try's wait to hear its own cast; the last repeats

_importing = threading.RLock()  # held while the preload imports: a fork waits for it (the import's own too)
_preloaded = threading.Event()
from ..procs import env as _procs_env

_procs_env.preload_wait = _preloaded.wait  # a gang's store host waits for the preload (procs/env.py StoreHost)
_answered = threading.Event()


def preload_names() -> list[str]:
    """The modules the worker preloads: ``GPULAYER_PRELOAD`` (comma separated; default torch, empty for none)."""
    return [n.strip() for n in os.environ.get("GPULAYER_PRELOAD", "torch").split(",") if n.strip()]


def answered() -> bool:
    """True once this worker heard its own cast (its starting mark is cleared)."""
    return _answered.is_set()


def preloaded() -> bool:
    """True once the preload finished (or had nothing to do)."""
    return _preloaded.is_set()


def _hold_fork() -> None:
    _importing.acquire()


def _release_fork() -> None:
    _importing.release()


os.register_at_fork(before=_hold_fork, after_in_parent=_release_fork, after_in_child=_release_fork)


def preload() -> None:
    """Import the preload modules (a missing one is skipped), forks held meanwhile."""
    with _importing:
        for name in preload_names():
            try:
                importlib.import_module(name)
            except ImportError as err:
                log.debug("gpulayer: cannot preload %s (%s)", name, err)


def answer_then_preload(consumer, registry, worker_id: str) -> threading.Thread:
    """From ``worker_ready``: a thread that waits until this worker hears its own cast, says so (the mark, the
    starter's pipe), then preloads and restarts the pool."""
    thread = threading.Thread(target=_run, args=(consumer, registry, worker_id), name="gpulayer-starting",
                              daemon=True)
    thread.start()
    return thread


def answers(app, nodename: str, limit: float = ANSWER_WAIT) -> bool:
    """Cast to ``nodename`` (this process's own node) until it hears it (True) or ``limit`` seconds pass (False).

    Heard here, in this process, rather than answered with a reply: a reply goes out through Celery's producer
    pool, and the cast through a connection of its own, closed after: the worker keeps no connection for it
    (tests/test_connections.py counts them)."""
    token = os.urandom(8).hex()
    heard = broadcast.listen_for_own_cast(token)
    end = time.monotonic() + limit
    tries = 0
    with app.connection_for_write() as connection:
        while time.monotonic() < end:
            timeout = PING_TIMEOUTS[min(tries, len(PING_TIMEOUTS) - 1)]
            tries += 1
            try:
                broadcast.cast_to_self(app, connection, nodename, token)
            except Exception as err:  # noqa: BLE001  (the broker restarting: try again)
                log.debug("gpulayer: own cast failed (%s)", err)
                time.sleep(timeout)
                continue
            if heard.wait(timeout):
                return True
    return False


def _run(consumer, registry, worker_id: str) -> None:
    nodename = consumer.hostname
    if not answers(consumer.app, nodename):
        log.warning("gpulayer: %s did not hear its own cast within %.0f s; telling it answers anyway",
                    nodename, ANSWER_WAIT)
    _answered.set()
    try:
        registry.mark_answering(worker_id)
    except Exception as err:  # noqa: BLE001  (Redis restarting: a broadcast waits for the mark's bound)
        log.warning("gpulayer: could not clear this worker's starting mark: %s", err)
    ready.tell(ready.CONSUMING, last=True)
    names = preload_names()
    if names:
        started = time.monotonic()
        preload()
        from ..engine.respawn import freeze_heap

        freeze_heap()  # what the preload built: the pool's gc.collect() before each fork skips it
        log.info("gpulayer: preloaded %s in %.1f s; the pool processes restart with it", ",".join(names),
                 time.monotonic() - started)
        if consumer.hub is not None:  # the pool is the event loop's: it is told from there
            consumer.hub.call_soon(recycle_pool, consumer.pool)
    _preloaded.set()


def _noop() -> None:
    """A pool job that does nothing: it wakes an idle pool process, which then sees it is to restart."""


def recycle_pool(pool) -> None:
    """Replace every pool process by a fork of the main process as it is now, each between two jobs.

    billiard's ``restart`` marks each process; a process sees its mark before it waits for its next job, and
    exits instead (a job already written to it goes to another, Celery's ``AsynPool`` puts it back). An idle
    process blocks in that wait without looking, so each is handed a no-op first. In the event loop's thread.
    """
    try:
        pool.restart()
        for _ in range(pool.num_processes):
            pool.apply_async(_noop)
    except Exception as err:  # noqa: BLE001  (the worker stopping meanwhile: nothing to restart)
        log.warning("gpulayer: the pool did not restart after the preload (%r)", err)
