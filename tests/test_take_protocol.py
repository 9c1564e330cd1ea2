"""Units of the take protocol (``engine/transport.py``) and the janitor (``worker/janitor.py``) on a real Redis.

No workers: the keys a worker would write are written here, so each rule is checked on its own.
"""

from __future__ import annotations


import pytest

from gpulayer.engine import transport
from gpulayer.store import keys
from gpulayer.worker import janitor


@pytest.fixture
def r(fresh_fleet):
    client = fresh_fleet.client()
    yield client
    client.close()


def test_a_taking_entry_keeps_its_queue_and_message_apart():
    entry = transport.copy_of(b"gl.q.cpu", b'{"body": "x\\ny"}')
    assert transport.split_copy(entry) == (b"gl.q.cpu", b'{"body": "x\\ny"}')  # a newline in the message survives


def test_what_a_dead_life_was_taking_goes_back_to_its_own_queue_and_rings_its_bell(r):
    life = keys.life("w-dead", 4242)
    r.rpush(keys.taking(life), transport.copy_of(b"gl.q.a", b"m1"), transport.copy_of(b"gl.q.b", b"m2"))
    assert sorted(transport.put_back_taking(r, life)) == [b"m1", b"m2"]
    assert r.lrange("gl.q.a", 0, -1) == [b"m1"] and r.lrange("gl.q.b", 0, -1) == [b"m2"]
    assert r.llen(keys.taking(life)) == 0
    assert r.llen(keys.bell("gl.q.a")) == 1 and r.llen(keys.bell("gl.q.b")) == 1  # idle takers wake up
    assert transport.put_back_taking(r, life) == []  # twice is once: nothing is put back two times
    assert r.llen("gl.q.a") == 1


def test_the_janitor_counts_what_it_put_back_and_leaves_other_lives_alone(r):
    dead, alive = keys.life("w-1", 1), keys.life("w-1", 2)
    r.rpush(keys.taking(dead), transport.copy_of(b"gl.q.a", b'{"headers": {"id": "j1"}}'))
    r.rpush(keys.taking(alive), transport.copy_of(b"gl.q.a", b'{"headers": {"id": "j2"}}'))
    assert janitor.put_back_takes(r, dead) == 1
    assert r.llen(keys.taking(alive)) == 1  # the new life of the same worker is not touched


def test_dead_workers_are_judged_by_redis_clock(r):
    secs, micros = r.time()
    now = secs + micros / 1e6
    r.zadd(keys.WORKERS, {"fresh": now - 0.5, "late": now - 3.0, "dead": now - 60.0})
    assert sorted(janitor.dead_workers(r, dead_after=5.0)) == ["dead"]
    assert sorted(janitor.dead_workers(r, dead_after=2.0)) == ["dead", "late"]
    assert janitor.dead_workers(r, dead_after=120.0) == []
