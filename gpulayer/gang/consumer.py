"""The control consumer: every worker serves the coordinator's queue outside its job slots.

A thread in the worker's main process (a bootstep, beside the gang agent) blocks on
``queues.CONTROL`` with its own Redis connection and runs each coordinator message
at once, so a pass is never queued behind the slot gate or a busy pool, and takes
no slot. The messages are Celery task messages (``coordinate.apply_async``, signed
like every other); they are popped, not acknowledged: a pass is idempotent and the
waiting line in Redis is the truth, so a message lost with its worker costs at most
the once-a-second sweep below. Celery's own consumer never sees this queue, so
``celery inspect`` and Flower show the job queues only.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import redis
from kombu import serialization

from .. import queues, signing
from ..engine import envelope
from ..store import keys
from ..store.connection import client_name, connect_redis
from ..engine.sentinel import broker_url
from ..procs import runtime
from ..loopstep import LoopStep
from .coordinator import COORDINATE, try_waiting

log = logging.getLogger(__name__)
_ACCEPT = serialization.prepare_accept_content([signing.NAME])  # the signed serializer's content type only

BLOCK = 1.0  # seconds a BRPOP waits before the consumer looks at the waiting line itself
SWEEP_MS = 1000  # at most one sweep of the waiting line per this many ms, fleet-wide


def read_message(raw: bytes) -> tuple[str, tuple, dict]:
    """A Celery task message as kombu's Redis transport keeps it -> (task name, args, kwargs).

    The body is checked by the signed serializer before anything is unpickled; any
    other content type is refused.
    """
    message = envelope.parse(raw)
    args, kwargs, _ = envelope.decode(message, accept=_ACCEPT)
    task = envelope.task_name(message)
    if task is None:
        raise ValueError("the message names no task")
    return task, args, kwargs


class ControlConsumer:
    """Blocks on the control queue and runs the coordinator; ``serve`` returns once ``stopping`` is set."""

    def __init__(self, url: str, name: str | None = None):
        self.url = url
        self.name = name  # the connection's name in CLIENT LIST

    def serve(self, stopping: threading.Event, blocks_on: Callable[[redis.Redis], None] | None = None) -> None:
        """``blocks_on``: told the client of the blocking read, after each (re)connect (``LoopStep.blocks_on``)."""
        client = connect_redis(self.url, socket_timeout=BLOCK + 10, name=self.name)
        connected = False
        try:
            while not stopping.is_set():
                try:
                    if blocks_on is not None and not connected:
                        blocks_on(client)
                        connected = True
                    item = client.brpop([queues.CONTROL], timeout=BLOCK)
                    if item:
                        self.handle(client, item[1])
                    elif client.zcard(keys.GANGS_WAITING) and client.set(keys.COORDINATOR_SWEEP, 1, nx=True,
                                                                         px=SWEEP_MS):
                        try_waiting(client)  # new workers, timeouts, a message lost with its worker
                except redis.RedisError as err:
                    connected = False
                    if not stopping.is_set():
                        log.warning("gpulayer control: cannot read the control queue (%s); retrying", err)
                    stopping.wait(1)
                except Exception:
                    log.exception("gpulayer control: a coordinator pass failed")
        finally:
            client.close()

    def handle(self, client, raw: bytes) -> None:
        try:
            task, _, _ = read_message(raw)
        except Exception as err:  # unsigned, foreign or damaged: never run
            log.warning("gpulayer control: refused a message on %s: %s", queues.CONTROL, err)
            return
        if task != COORDINATE:
            log.warning("gpulayer control: refused task %r on %s (it runs only %s)", task, queues.CONTROL, COORDINATE)
            return
        try_waiting(client)  # every waiting gang, not only the one the message names


class ControlStep(LoopStep):
    """Worker bootstep: the control consumer in its own thread, started after the pool, stopped with the worker."""

    thread_name = "gpulayer-control"

    def loop(self) -> None:
        name = client_name(runtime.current_worker().id, "control")
        ControlConsumer(broker_url(self.app), name).serve(self.stopping, self.blocks_on)
