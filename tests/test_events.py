"""Task events: every event of every job reaches monitors, in far fewer publishes than events."""

from __future__ import annotations

import base64
import json

from gpulayer import submit, submit_batch
from gpulayer.engine.events import FLUSH_EVERY, EventPacer


def tiny(i):
    return i


def decode_events(raw: bytes) -> list[dict]:
    message = json.loads(raw)
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    events = json.loads(body)
    return events if isinstance(events, list) else [events]


def test_every_task_event_arrives_in_fewer_publishes_than_jobs(fleet):
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
