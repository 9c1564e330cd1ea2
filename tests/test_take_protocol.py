"""Units of the take protocol (``engine/transport.py``) and the janitor (``worker/janitor.py``) on a real Redis.

No workers: the keys a worker would write are written here, so each rule is checked on its own.
"""

from __future__ import annotations

import json

import pytest
from kombu.transport.redis import Channel

from gpulayer.app import app
from gpulayer.store import keys
from gpulayer.store.registry import Registry, load_script
from gpulayer.worker import janitor

UNACKED, UNACKED_INDEX = Channel.unacked_key, Channel.unacked_index_key


@pytest.fixture
def r(fresh_fleet):
    client = fresh_fleet.client()
    yield client
    client.close()


def test_a_take_leaves_each_message_in_its_queue_or_in_the_unacked_records_and_nowhere_else(r):
    """take.lua pops and records in one step: no key of the taker's life (or any other) holds a message between."""
    life = keys.life("w-take", 5)
    item = kombu_message("j-nl", "t-nl", body="x\ny")  # a newline in the message survives
    r.lpush("gl.q.cpu", item)
    before = set(r.keys("*"))
    got = take(r, ["gl.q.cpu"], life, 1)
    assert got == [b"gl.q.cpu", item] and r.llen("gl.q.cpu") == 0
    assert set(r.keys("*")) - before == {UNACKED.encode(), UNACKED_INDEX.encode(), keys.inflight(life).encode()}
    assert json.loads(r.hget(UNACKED, "t-nl"))[0] == json.loads(item)
    assert r.hgetall(keys.inflight(life)) == {b"t-nl": b"j-nl"}


def test_what_a_dead_life_took_goes_back_to_its_own_queue_once_and_rings_its_bell(r, fresh_fleet):
    fresh_fleet.connect()
    life = keys.life("w-dead", 4242)
    r.lpush("gl.q.a", kombu_message("j1", "t1", queue="gl.q.a"))
    r.lpush("gl.q.b", kombu_message("j2", "t2", queue="gl.q.b"))
    assert len(take(r, ["gl.q.a", "gl.q.b"], life, 2)) == 4
    assert janitor.hand_back(app, r, life, "test", max_deliveries=3) == (2, 0)
    assert [json.loads(m)["headers"]["id"] for m in r.lrange("gl.q.a", 0, -1)] == ["j1"]
    assert [json.loads(m)["headers"]["id"] for m in r.lrange("gl.q.b", 0, -1)] == ["j2"]
    assert r.hlen(keys.inflight(life)) == 0 and r.hlen(UNACKED) == 0 and r.zcard(UNACKED_INDEX) == 0
    assert r.llen(keys.bell("gl.q.a")) == 1 and r.llen(keys.bell("gl.q.b")) == 1  # idle takers wake up
    assert janitor.hand_back(app, r, life, "test", max_deliveries=3) == (0, 0)  # twice is once
    assert r.llen("gl.q.a") == 1


def test_the_janitor_counts_what_it_put_back_and_leaves_other_lives_alone(r, fresh_fleet):
    fresh_fleet.connect()
    dead, alive = keys.life("w-1", 1), keys.life("w-1", 2)
    r.lpush("gl.q.a", kombu_message("j1", "t1"), kombu_message("j2", "t2"))
    take(r, ["gl.q.a"], dead, 1)
    take(r, ["gl.q.a"], alive, 1)
    assert janitor.hand_back(app, r, dead, "test", max_deliveries=3) == (1, 0)
    assert r.hgetall(keys.inflight(alive)) == {b"t2": b"j2"}  # the new life of the same worker is not touched
    assert r.hkeys(UNACKED) == [b"t2"]


def test_dead_workers_are_judged_by_redis_clock(r):
    secs, micros = r.time()
    now = secs + micros / 1e6
    r.zadd(keys.WORKERS, {"fresh": now - 0.5, "late": now - 3.0, "dead": now - 60.0})
    assert sorted(Registry(r, dead_after=5.0).dead()) == ["dead"]  # the janitor's reader of the death line
    assert sorted(Registry(r, dead_after=2.0).dead()) == ["dead", "late"]
    assert Registry(r, dead_after=120.0).dead() == {}


def kombu_message(job_id: str, tag: str, queue: str = "gl.q.a", body: str = "Ym9keQ==") -> bytes:
    """A message as kombu's Redis transport publishes it: the body first, then the envelope."""
    return json.dumps({"body": body, "content-encoding": "binary", "content-type": "application/x-gpulayer-signed",
                       "headers": {"id": job_id, "argsrepr": 'f("x\\\\y")'},
                       "properties": {"delivery_info": {"exchange": "", "routing_key": queue},
                                      "delivery_tag": tag}}).encode()


def take(r, queues_, life, want, acks=(), results=()):
    """take.lua as the worker's channel calls it; ``results``: (result key, done key, value, expires) each."""
    script = load_script(r, "take")
    result_keys = [k for key, done, _, _ in results for k in (key, done)]
    result_args = [a for _, _, value, expires in results for a in (value, expires)]
    return script(keys=[*queues_, UNACKED, UNACKED_INDEX, keys.inflight(life), *result_keys],
                  args=[want, 1000.0, len(results), 0, *result_args, *acks])


def test_a_take_records_each_message_it_takes_in_the_same_step_and_acks_what_it_carries(r):
    life = keys.life("w-take", 7)
    for i in range(5):
        r.lpush("gl.q.a", kombu_message(f"j{i}", f"t{i}"))
    got = take(r, ["gl.q.b", "gl.q.a"], life, 3)
    assert got[0::2] == [b"gl.q.a"] * 3 and [json.loads(m)["headers"]["id"] for m in got[1::2]] == ["j0", "j1", "j2"]
    assert r.llen("gl.q.a") == 2
    assert r.hgetall(keys.inflight(life)) == {b"t0": b"j0", b"t1": b"j1", b"t2": b"j2"}
    assert r.zrange(UNACKED_INDEX, 0, -1, withscores=True) == [(b"t0", 1000.0), (b"t1", 1000.0), (b"t2", 1000.0)]
    # kombu's own unacked entry: [message, exchange, routing key], the message as it was taken
    message, exchange, routing_key = json.loads(r.hget(UNACKED, "t1"))
    assert (message, exchange, routing_key) == (json.loads(got[3]), "", "gl.q.a")
    # The next take acks t0 and t1 (their records go) and takes the rest.
    got = take(r, ["gl.q.a"], life, 8, acks=["t0", "t1"])
    assert len(got) == 4 and r.llen("gl.q.a") == 0
    assert sorted(r.hkeys(keys.inflight(life))) == [b"t2", b"t3", b"t4"]
    assert sorted(r.hkeys(UNACKED)) == [b"t2", b"t3", b"t4"] and r.zcard(UNACKED_INDEX) == 3
    assert take(r, ["gl.q.a"], life, 8) == []  # empty queues: nothing, and nothing recorded


def test_a_take_stores_the_results_it_carries_before_their_acks_once_per_job(r):
    """The worker's main process stores its jobs' results in the take that acks them (engine/results.py,
    StoreLater): stored, marked done and published in the same step, never over a result already stored."""
    life = keys.life("w-take", 9)
    for i in range(2):
        r.lpush("gl.q.a", kombu_message(f"j{i}", f"t{i}"))
    take(r, ["gl.q.a"], life, 2)
    pubsub = r.pubsub()
    pubsub.subscribe("celery-task-meta-j0")
    pubsub.get_message(timeout=5)  # the subscription's confirmation
    results = [("celery-task-meta-j0", keys.job_done("j0"), '{"status": "SUCCESS", "result": 0}', 60),
               ("celery-task-meta-j1", keys.job_done("j1"), '{"status": "SUCCESS", "result": 1}', 60)]
    r.lpush("gl.q.a", kombu_message("j2", "t2"))
    got = take(r, ["gl.q.a"], life, 1, acks=["t0", "t1"], results=results)
    assert [json.loads(m)["headers"]["id"] for m in got[1::2]] == ["j2"]
    assert r.get("celery-task-meta-j1") == b'{"status": "SUCCESS", "result": 1}'
    assert r.get(keys.job_done("j0")) == b"1" and 0 < r.ttl("celery-task-meta-j0") <= 60
    assert sorted(r.hkeys(keys.inflight(life))) == [b"t2"] and sorted(r.hkeys(UNACKED)) == [b"t2"]
    published = pubsub.get_message(timeout=5)
    assert published["data"] == b'{"status": "SUCCESS", "result": 0}'
    # A rerun's result (a message delivered again after its worker died with the ack unsent) changes nothing.
    take(r, [], life, 0, results=[("celery-task-meta-j0", keys.job_done("j0"), '{"status": "SUCCESS", "result": 9}', 60)])
    assert r.get("celery-task-meta-j0") == b'{"status": "SUCCESS", "result": 0}'
    pubsub.close()


def test_a_message_whose_body_is_not_base64_is_still_recorded(r):
    life = keys.life("w-take", 8)
    r.lpush("gl.q.a", kombu_message("j-odd", "t-odd", body='a "quoted\\" body'))
    assert len(take(r, ["gl.q.a"], life, 1)) == 2
    assert r.hget(keys.inflight(life), "t-odd") == b"j-odd"


def test_prefetched_messages_go_back_to_the_head_of_their_queues_as_taken_once(r):
    life = keys.life("w-give", 9)
    for i in range(4):
        r.lpush("gl.q.a", kombu_message(f"j{i}", f"t{i}"))
    got = take(r, ["gl.q.a"], life, 3)  # j0 starts, j1 and j2 wait on the worker; j3 stays queued
    give_back = load_script(r, "give_back")
    args = ["t1", got[3], "t2", got[5]]
    assert give_back(keys=[UNACKED, UNACKED_INDEX, keys.inflight(life), "gl.q.a", "gl.q.a"], args=args) == 2
    # At the consuming end in the order they were taken, unchanged (never marked redelivered), then j3.
    assert [json.loads(m)["headers"]["id"] for m in reversed(r.lrange("gl.q.a", 0, -1))] == ["j1", "j2", "j3"]
    assert r.lrange("gl.q.a", -1, -1) == [got[3]]
    assert r.hkeys(keys.inflight(life)) == [b"t0"] and r.hkeys(UNACKED) == [b"t0"] and r.zcard(UNACKED_INDEX) == 1
    # Twice is once: a message handed back already (by this, the janitor or a reconnect) is not pushed again.
    assert give_back(keys=[UNACKED, UNACKED_INDEX, keys.inflight(life), "gl.q.a", "gl.q.a"], args=args) == 0
    assert r.llen("gl.q.a") == 3
