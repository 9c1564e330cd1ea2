"""Celery's monitoring events: off until a monitor asks, then at a steady pace.

**Off by default.** Task events and Celery's worker-heartbeat events (one publish per
worker every 2 s) go out on the event exchange, a Redis PUBLISH that costs the more the
bigger the fleet, whether or not anything listens. So a worker starts with both off
(``GPULAYER_EVENTS=1`` turns them on from the start, as ``gpulayer up --flower`` does for its workers,
so its Flower lists every job from the first) and without the Redis connection they
would use, and turns them on when a monitor asks: Flower broadcasts ``enable_events``
every 5 s, and ``celery -A gpulayer.app control enable_events`` does the same for
``celery events``. Celery's own ``enable_events`` adds the task group to a dispatcher that
sends the worker group (heartbeats) from the start; gpulayer's dispatcher starts with no
group at all, and its ``enable_events`` turns on both (Flower shows a worker as online from
its heartbeats); ``disable_events`` turns both off again unless the worker was started
with events on.

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
from celery.worker.consumer.events import Events

from .upstream import patch

log = logging.getLogger(__name__)
FLUSH_EVERY = 0.1  # seconds


OFF = "gpulayer-off"  # an event group no event belongs to: a dispatcher with only this group sends nothing


def events_on_at_start(app) -> bool:
    """Whether this worker sends events from the start (``GPULAYER_EVENTS``, set as Celery's -E)."""
    return bool(app.conf.worker_send_task_events)


class EventPacer(bootsteps.StartStopStep):
    """Consumer step: replace Celery's flush-on-the-next-turn with a flush within ``FLUSH_EVERY``; with
    events off, Celery's dispatcher starts filtering every event out, on a connection not yet opened."""

    requires = {"celery.worker.consumer.events:Events"}

    def __init__(self, c, **kwargs):
        super().__init__(c, **kwargs)
        self.pending = False
        self.consumer = c
        if c.hub is not None:  # Events.start reads it when it builds the dispatcher
            patch(c, "celery.worker.consumer.consumer:Consumer.on_send_event_buffered", self.on_send_buffered)
        if not events_on_at_start(c.app):
            # The dispatcher is built on (Celery's task strategies decide once, at start, whether a worker
            # may ever send task events) but sends no group; Events.start connects it at once, so it gets
            # a lazy connection: nothing is opened until a monitor turns events on.
            c.blueprint.steps[Events.name].groups = [OFF]
            patch(c, "celery.worker.consumer.consumer:Consumer.connection_for_write", self.lazy_connection)

    def lazy_connection(self, url=None, heartbeat=None):
        """A kombu connection for the dispatcher that connects on its first publish, not before."""
        conn = self.consumer.app.connection_for_write(url=url, heartbeat=heartbeat)
        # The event loop asks its broker-heartbeat interval (celery.worker.loops._enable_amqheartbeats),
        # which connects; the Redis transport has none, whatever the connection (0).
        patch(conn, "kombu.connection:Connection.get_heartbeat_interval",
              lambda: conn.transport.get_heartbeat_interval(None))
        return conn

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


_celery_enable_events = control.Panel.data["enable_events"]
_celery_disable_events = control.Panel.data["disable_events"]


@control.control_command()
def enable_events(state):
    """Tell worker(s) to send task events (gpulayer: and worker heartbeats, both off at start)."""
    dispatcher = state.consumer.event_dispatcher
    if dispatcher is None or events_on_at_start(state.app) or OFF not in dispatcher.groups:
        return _celery_enable_events(state)
    dispatcher.groups.clear()
    dispatcher.groups.update({"worker", "task"})
    log.info("gpulayer: task events and worker heartbeats enabled by remote")
    return control.ok("task events enabled")


@control.control_command()
def disable_events(state):
    """Tell worker(s) to stop sending task events (gpulayer: and worker heartbeats, unless started with them)."""
    dispatcher = state.consumer.event_dispatcher
    if dispatcher is None or events_on_at_start(state.app):
        return _celery_disable_events(state)
    if OFF in dispatcher.groups:
        return control.ok("task events already disabled")
    dispatcher.groups.clear()
    dispatcher.groups.add(OFF)
    log.info("gpulayer: task events and worker heartbeats disabled by remote")
    return control.ok("task events disabled")
