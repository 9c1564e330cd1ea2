"""Celery's monitoring events: off until a monitor asks, then at a steady pace.

**Off by default.** Task events and Celery's worker-heartbeat events (one publish per
worker every 2 s) go out on the event exchange, a Redis PUBLISH that costs the more the
bigger the fleet, whether or not anything listens. So a worker starts with both off
(``GPULAYER_EVENTS=1`` turns them on from the start) and without the Redis connection they
would use, and turns them on when a monitor asks: Flower broadcasts ``enable_events``
every 5 s, and ``celery -A gpulayer.app control enable_events`` does the same for
``celery events``. Celery's own ``enable_events`` only adds the task group to a dispatcher
that is already on, so gpulayer's replaces it: it turns the dispatcher on, and the worker
heartbeats with it (Flower shows a worker as online from those); ``disable_events`` turns
both off again unless the worker was started with events on.

**Paced.** Celery buffers a worker's task events (received, started, succeeded, failed)
and flushes the buffer on the event loop's next turn, so a worker running tiny jobs sends
a PUBLISH for almost every event: measured here, ~35% of the throughput of 2 workers
running 2,000 tiny jobs. ``EventPacer`` flushes at most every ``FLUSH_EVERY`` seconds
instead (Celery still flushes at once when 50 events wait), so Flower sees a job at most
that much later, and a burst of jobs costs one publish per tenth of a second. It replaces
Celery 5.7's ``Consumer.on_send_event_buffered`` on the worker's consumer and calls its
``_flush_events`` (pinned in engine/upstream.py).
"""

from __future__ import annotations

import logging

from celery import bootsteps
from celery.worker import control
from celery.worker.heartbeat import Heart

from .upstream import patch

log = logging.getLogger(__name__)
FLUSH_EVERY = 0.1  # seconds


def events_on_at_start(app) -> bool:
    """Whether this worker sends events from the start (``GPULAYER_EVENTS``, set as Celery's -E)."""
    return bool(app.conf.worker_send_task_events)


class EventPacer(bootsteps.StartStopStep):
    """Consumer step: replace Celery's flush-on-the-next-turn with a flush within ``FLUSH_EVERY``;
    with events off, Celery's event dispatcher gets a connection that connects only once events are on."""

    requires = {"celery.worker.consumer.events:Events"}

    def __init__(self, c, **kwargs):
        super().__init__(c, **kwargs)
        self.pending = False
        self.consumer = c
        if c.hub is not None:  # Events.start reads it when it builds the dispatcher
            patch(c, "celery.worker.consumer.consumer:Consumer.on_send_event_buffered", self.on_send_buffered)
        if not events_on_at_start(c.app):
            # Events.start connects its dispatcher's connection at once, on or off: lazily, nothing
            # is opened until a monitor turns events on (the dispatcher's first publish connects).
            patch(c, "celery.worker.consumer.consumer:Consumer.connection_for_write",
                  lambda url=None, heartbeat=None: c.app.connection_for_write(url=url, heartbeat=heartbeat))

    def start(self, c) -> None:
        self.pending = False  # a (re)started consumer: a flush scheduled before a reconnect does not count

    def on_send_buffered(self) -> None:
        if not self.pending:
            self.pending = True
            self.consumer.hub.call_later(FLUSH_EVERY, self.flush)

    def flush(self) -> None:
        self.pending = False
        self.consumer._flush_events()

    def shutdown(self, c) -> None:
        c._flush_events()  # what waits in the buffer goes out before Events closes the dispatcher
        if getattr(c, "gl_heart", None) is not None:  # the heart enable_events started says worker-offline
            c.gl_heart.stop()
            c.gl_heart = None


@control.control_command()
def enable_events(state):
    """Tell worker(s) to send task events and worker heartbeats (gpulayer: both start off)."""
    c = state.consumer
    dispatcher = c.event_dispatcher
    if dispatcher is None:
        return control.nok("event dispatcher unavailable")
    was_on = dispatcher.enabled and "task" in (dispatcher.groups or {"task"})
    if not dispatcher.enabled:
        dispatcher.enable()
    if dispatcher.groups and "task" not in dispatcher.groups:
        dispatcher.groups.add("task")
    if c.heart is None and getattr(c, "gl_heart", None) is None:  # started without Celery's heartbeat step
        c.gl_heart = Heart(c.timer, dispatcher)
        c.gl_heart.start()
    if was_on:
        return control.ok("task events already enabled")
    log.info("gpulayer: task events and worker heartbeats enabled by remote")
    return control.ok("task events enabled")


@control.control_command()
def disable_events(state):
    """Tell worker(s) to stop sending task events (and worker heartbeats, unless started with events on)."""
    c = state.consumer
    dispatcher = c.event_dispatcher
    if dispatcher is None:
        return control.nok("event dispatcher unavailable")
    if events_on_at_start(c.app):  # Celery's own behaviour: the task group goes, heartbeats stay
        if "task" not in dispatcher.groups:
            return control.ok("task events already disabled")
        dispatcher.groups.discard("task")
    elif not dispatcher.enabled:
        return control.ok("task events already disabled")
    else:
        if getattr(c, "gl_heart", None) is not None:
            c.gl_heart.stop()  # says worker-offline while the dispatcher is still on
            c.gl_heart = None
        dispatcher.groups.discard("task")
        dispatcher.disable()
    log.info("gpulayer: task events disabled by remote")
    return control.ok("task events disabled")
