"""The client's own publish and result reads (engine/publish.py, tasks/readahead.py), against a real Redis and
real workers: the message it sends is the one Celery's publish sends, who sent what is recorded as before, a
publish signal still sees every job, and a loop of get() reads each result once, failures included."""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager

import pytest
import redis
from celery import signals
from kombu.utils.json import dumps

from gpulayer import JobFailed, submit, submit_batch
from gpulayer import app as app_mod
from gpulayer.engine import publish, senders
from gpulayer.lab.fleet import wait_until
from gpulayer.payload import pack_function
from gpulayer.store import durability, keys
from gpulayer.store.sent import batch_members, sent_by
from gpulayer.tasks import readahead


def square(x):
    return x * x


def fails_on(bad, x):
    if x == bad:
        raise ValueError(f"shard {x} is bad")
    return x


def _without_tag(raw: bytes) -> dict:
    message = json.loads(raw)
    assert message["properties"].pop("delivery_tag")
    return message


def test_the_direct_message_is_the_one_celery_publishes(fleet):
    app = app_mod.app
    queue = f"test-publish-{uuid.uuid4().hex[:8]}"  # no worker takes from it
    job_id, me = str(uuid.uuid4()), app_mod.client_identity()
    headers = {app_mod.RESOURCES_HEADER: {}, senders.CLIENT_HEADER: me}
    args = (pack_function(square), 3)
    client = fleet.client()
    try:
        with app.producer_or_acquire() as producer:
            publish.publish_task(app, producer, submit.name, job_id, args, {"k": 1}, queue, headers, "square(3)", "",
                                 shadow="square")
            channel = publish.direct(app, producer, queue, headers)
            assert channel is not None  # declared by the publish above
            raw = publish.build(app, channel, submit.name, job_id, args, {"k": 1}, queue, headers, "square(3)", "",
                                shadow="square")
            assert raw == dumps(json.loads(raw))  # the text kombu's JSON gives, not only the same object
            publish.publish_one(channel, queue, raw, job_id, me)
        by_celery, direct = client.rpop(queue), client.rpop(queue)
        assert _without_tag(direct) == _without_tag(by_celery)
        assert client.llen(keys.bell(queue)) >= 2  # both rang the queue's bell
        assert client.zscore(keys.client_jobs(me), job_id) is not None
    finally:
        client.delete(queue, keys.bell(queue))


def test_delay_and_batch_record_who_sent_them_for_cancel(fleet):
    me = app_mod.client_identity()
    h = submit.delay(square, 2)
    batch = submit_batch([submit.s(square, i) for i in range(7)], chunk_size=3)  # three chunks
    client = fleet.client()
    assert sorted(batch_members(client, batch.id)) == sorted(batch.ids)
    assert set(batch.ids) | {h.id} <= set(sent_by(client, me))
    assert client.sismember(keys.CLIENTS, me)
    assert 0 < client.ttl(keys.client_jobs(me)) <= keys.SENT_KEEP_SECONDS
    assert 0 < client.ttl(keys.batch(batch.id)) <= keys.SENT_KEEP_SECONDS
    assert batch.get(timeout=60) == [i * i for i in range(7)] and h.get(timeout=60) == 4


def test_a_publish_signal_sees_every_job(fleet):
    seen = []

    def before(sender=None, headers=None, **_):
        seen.append(headers["id"])

    signals.before_task_publish.connect(before, weak=False)
    try:
        h = submit.delay(square, 5)
        batch = submit_batch([submit.s(square, i) for i in range(4)])
    finally:
        signals.before_task_publish.disconnect(before)
    assert seen == [h.id, *batch.ids]
    assert h.get(timeout=60) == 25 and batch.get(timeout=60) == [0, 1, 4, 9]


def test_a_loop_of_get_reads_each_result_once_with_its_failure(fleet):
    handles = [submit.delay(fails_on, 13, i) for i in range(40)]
    assert handles[0].get(timeout=60) == 0
    handles[-1].get(timeout=60, propagate=False)  # all have finished now: the next gets read ahead
    out = []
    for h in handles[1:-1]:
        try:
            out.append(h.get(timeout=60))
        except JobFailed as err:
            out.append(err.type_name)
    assert out == [*range(1, 13), "ValueError", *range(14, 39)]
    assert not any(h.id in readahead._kept for h in handles)  # each handed to its own handle


def _stored(fleet, *handles) -> None:
    """Wait until every one of ``handles`` has its result stored (without reading it through the handle)."""
    client = fleet.client()
    wait_until(lambda: client.exists(*(h.backend.get_key_for_task(h.id) for h in handles)) == len(handles), 60,
               "the jobs' results to be stored")


def test_a_result_read_ahead_goes_to_its_handle_unless_forgotten(fleet):
    first, second, third = submit.delay(square, 1), submit.delay(square, 2), submit.delay(square, 3)
    _stored(fleet, first, second, third)
    assert first.get(timeout=60) == 1
    assert second.id in readahead._kept and third.id in readahead._kept  # read with the first's result
    third.forget()
    assert third.id not in readahead._kept
    assert second.get(timeout=60) == 4 and second.id not in readahead._kept


@pytest.mark.parametrize("n", [1, 300])
def test_results_read_ahead_are_bounded(fleet, monkeypatch, n):
    monkeypatch.setattr(readahead, "KEEP", 5)
    handles = [submit.delay(square, i) for i in range(n + 10)]
    handles[-1].get(timeout=60)
    handles[0].get(timeout=60)
    assert len(readahead._kept) <= 5
    assert [h.get(timeout=60) for h in handles] == [i * i for i in range(n + 10)]


def test_a_batch_sent_again_with_its_ids_stores_each_result_once(fleet):
    """A signature's own id (``.set(task_id=...)``) is the job's: a batch that raised (``NotReplicated``,
    ``ClusterUnavailable``) is sent again with the same ids, and each job's handle and result are the same."""
    ids = [str(uuid.uuid4()) for _ in range(5)]
    first = submit_batch([submit.s(square, i).set(task_id=ids[i]) for i in range(5)])
    assert list(first.ids) == ids
    assert first.get(timeout=60) == [i * i for i in range(5)]
    again = submit_batch([submit.s(square, i).set(task_id=ids[i]) for i in range(5)])
    assert list(again.ids) == ids
    assert again.get(timeout=60) == [i * i for i in range(5)]
    mixed = submit_batch([submit.s(square, 7).set(task_id=ids[0]), submit.s(square, 8)])
    assert mixed.ids[0] == ids[0] and mixed.ids[1] not in ids


class _ChannelOn:
    """What publish_chunk needs of kombu's channel: a client of the primary, and what a write waits for."""

    def __init__(self, client):
        self.client, self.durability = client, durability.NONE

    @contextmanager
    def conn_or_acquire(self):
        yield self.client


@pytest.mark.parametrize("ran", [True, False], ids=["reply lost", "request lost"])
def test_a_chunk_cut_mid_call_is_sent_again_only_where_the_primary_lacks_it(fleet, monkeypatch, ran):
    """A connection broken mid-call (the primary killed, issue 41): the chunk's script ran whole or not at all,
    so it is sent again only when the primary lacks it, and the queue holds each job once either way."""
    client = fleet.client()
    queue, batch_id = f"gl.test.cut.{uuid.uuid4().hex}", uuid.uuid4().hex
    ids = [f"cut-{i}" for i in range(5)]
    real, calls = durability.call_script, []

    def cut_once(*args):
        calls.append(args)
        if len(calls) == 1:
            if ran:
                real(*args)
            raise redis.ConnectionError("Connection reset by peer")
        return real(*args)

    monkeypatch.setattr(durability, "call_script", cut_once)
    try:
        publish.publish_chunk(_ChannelOn(client), queue, [json.dumps({"id": i}) for i in ids], ids, "cut-test",
                              batch_id)
        assert len(calls) == (1 if ran else 2)
        assert sorted(json.loads(m)["id"] for m in client.lrange(queue, 0, -1)) == ids
        assert batch_members(client, batch_id) == ids
    finally:
        client.delete(queue, keys.bell(queue), keys.batch(batch_id), keys.client_jobs("cut-test"))
        client.close()
