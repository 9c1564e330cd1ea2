"""Task events: off until a monitor asks; then every event of every job reaches monitors, in far fewer
publishes than events."""

from __future__ import annotations

import base64
import json
import time
from types import SimpleNamespace

from gpulayer import submit, submit_batch
from gpulayer.app import app
from gpulayer.engine.events import FLUSH_EVERY, EventPacer
from gpulayer.lab.fleet import wait_until

from .fleets import running_fleet


def tiny(i):
    return i


def decode_events(raw: bytes) -> list[dict]:
    message = json.loads(raw)
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    events = json.loads(body)
    return events if isinstance(events, list) else [events]


def enable_events(workers: int) -> None:
    """What a monitor does (Flower every 5 s): ask every worker for events, here waiting for each to answer."""
    replies = app.control.enable_events(reply=True, limit=workers, timeout=10)
    assert len(replies) == workers and all("ok" in r for reply in replies for r in reply.values()), replies


def test_every_task_event_arrives_in_fewer_publishes_than_jobs(fleet):
    enable_events(len(fleet.workers))  # events are off until a monitor asks
    client = fleet.client()
    pubsub = client.pubsub()
    pubsub.psubscribe("*celeryev*")  # Celery's event exchange: a Redis PUBLISH per flush
    assert pubsub.get_message(timeout=5)["type"] == "psubscribe"
    jobs = 300
    batch = submit_batch([submit.s(tiny, i) for i in range(jobs)])
    ids = set(batch.ids)
    assert batch.get(timeout=120) == list(range(jobs))

    seen: dict[str, set] = {"task-received": set(), "task-started": set(), "task-succeeded": set()}
    publishes = 0
    while any(len(s) < jobs for s in seen.values()):
        message = pubsub.get_message(timeout=10)
        assert message is not None, {k: len(v) for k, v in seen.items()}  # an event never came
        if message["type"] != "pmessage":
            continue
        events = [e for e in decode_events(message["data"]) if e.get("uuid") in ids]
        publishes += bool(events)
        for e in events:
            if e["type"] in seen:
                seen[e["type"]].add(e["uuid"])
    # Celery alone publishes once per event here (900); paced, a worker flushes every 0.1 s or 50 events.
    assert publishes < jobs, f"{publishes} publishes for {3 * jobs} events"
    pubsub.close()
    client.close()


class FakeHub:
    def __init__(self):
        self.later = []

    def call_later(self, delay, callback, *args):
        self.later.append((delay, callback))


class FakeConsumer:
    def __init__(self):
        self.hub = FakeHub()
        self.app = SimpleNamespace(conf=SimpleNamespace(worker_send_task_events=True))  # a worker started with -E
        self.flushes = 0

    def _flush_events(self):
        self.flushes += 1


def test_the_pacer_schedules_one_flush_per_interval():
    c = FakeConsumer()
    pacer = EventPacer(c)
    assert c.on_send_event_buffered == pacer.on_send_buffered  # what Events.start hands the dispatcher
    for _ in range(100):
        c.on_send_event_buffered()
    assert [d for d, _ in c.hub.later] == [FLUSH_EVERY] and c.flushes == 0
    c.hub.later.pop()[1]()
    assert c.flushes == 1
    c.on_send_event_buffered()  # after a flush, the next event schedules the next one
    assert len(c.hub.later) == 1
    pacer.shutdown(c)  # the worker stops: what waits goes out
    assert c.flushes == 2


def event_types(pubsub, seconds: float) -> list[tuple[str, str]]:
    """(type, task id or hostname) of every event published on the event exchange within ``seconds``."""
    out = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message and message["type"] == "pmessage":
            out += [(e["type"], e.get("uuid") or e.get("hostname")) for e in decode_events(message["data"])]
    return out


def test_events_are_off_until_a_monitor_asks_and_off_again_when_it_says(tmp_path):
    """No publish on the event exchange from a worker nobody watches, not even its heartbeat events;
    enable_events (what Flower sends every 5 s) turns task events and worker heartbeats on, disable_events
    turns both off again."""
    with running_fleet(tmp_path, {"w-ev": {"slots": 1, "torch": False}}, connect=True) as fleet:
        client = fleet.client()
        pubsub = client.pubsub()
        pubsub.psubscribe("*celeryev*")
        assert pubsub.get_message(timeout=5)["type"] == "psubscribe"
        assert submit.delay(tiny, 1).get(timeout=60) == 1
        # Celery's worker heartbeat goes out every 2 s: 3 s without one is a worker that sends none.
        assert event_types(pubsub, 3.0) == []

        enable_events(1)
        job = submit.delay(tiny, 2)
        assert job.get(timeout=60) == 2
        seen: list = []

        def saw(kind: str, ident: str | None = None) -> bool:
            seen.extend(event_types(pubsub, 0.2))
            return any(t == kind and ident in (None, i) for t, i in seen)

        wait_until(lambda: saw("task-succeeded", job.id) and saw("worker-heartbeat"), timeout=30,
                   what="the job's events and the worker's heartbeat events")
        assert saw("task-received", job.id) and saw("task-started", job.id)

        replies = app.control.disable_events(reply=True, limit=1, timeout=10)
        assert replies and "ok" in next(iter(replies[0].values())), replies
        after = submit.delay(tiny, 3)
        assert after.get(timeout=60) == 3
        assert [e for e in event_types(pubsub, 3.0) if e[1] == after.id or e[0] == "worker-heartbeat"] == []
        pubsub.close()
        client.close()
