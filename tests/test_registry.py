"""The versioned registry against a real Redis: full reads once, then only what changed."""

from __future__ import annotations


import pytest

from gpulayer.deadline import wait_until
from gpulayer.models import WorkerInfo
from gpulayer.store import keys
from gpulayer.store.connection import connect_redis
from gpulayer.store.registry import CachedSnapshot, FleetView, Registry


def info(i: int, **kw) -> WorkerInfo:
    base = dict(id=f"w{i:03d}", hostname=f"h{i}", address="127.0.0.1", zone=f"z{i % 3}", region=f"r{i % 2}",
                gpus=8 if i % 5 == 0 else 0, slots=8, pid=1000 + i)
    return WorkerInfo(**{**base, **kw})


@pytest.fixture
def registry(fresh_fleet):
    client = fresh_fleet.client()
    yield Registry(client, dead_after=5.0)
    client.close()


def test_batched_heartbeats_register_every_worker_with_its_load(registry):
    fleet = [info(i, busy=i % 8, held=i % 2) for i in range(1200)]  # more than one script call
    registry.heartbeat_many(fleet)
    snap = registry.snapshot()
    assert [w.id for w in snap] == sorted(w.id for w in fleet)
    by_id = {w.id: w for w in snap}
    for w in fleet:
        got = by_id[w.id]
        assert got.model_dump(exclude={"heartbeat_age"}) == w.model_dump(exclude={"heartbeat_age"})
        assert 0.0 <= got.heartbeat_age < 5.0
    # The full record other readers use (reserve.lua, the janitor) stays current too.
    raw = registry.client.hget(keys.WORKERS_INFO, "w007")
    assert WorkerInfo.model_validate_json(raw).busy == 7


def test_heartbeat_times_come_from_redis_clock(registry):
    registry.heartbeat(info(1))
    sec, usec = registry.client.time()
    score = registry.client.zscore(keys.WORKERS, "w001")
    assert abs(score - (sec + usec / 1e6)) < 2.0


def test_unchanged_heartbeats_do_not_bump_the_version_and_refresh_returns_the_same_tuple(registry):
    fleet = [info(i) for i in range(50)]
    registry.heartbeat_many(fleet)
    view = FleetView(registry)
    first = view.refresh()
    version = view.version
    registry.heartbeat_many(fleet)
    assert view.refresh() is first
    assert view.version == version and view.full_reads == 1


def test_a_busy_count_change_is_read_as_load_only(registry):
    fleet = [info(i) for i in range(50)]
    registry.heartbeat_many(fleet)
    view = FleetView(registry)
    view.refresh()
    since = view.version
    registry.heartbeat_many([fleet[3].model_copy(update={"busy": 5, "held": 2})])
    ch = registry.changes(since)
    assert ch.records == [] and ch.load == {"w003": (5, 2)}
    snap = view.refresh()
    w3 = next(w for w in snap if w.id == "w003")
    assert (w3.busy, w3.held, w3.free) == (5, 2, 1)
    assert w3 == fleet[3].model_copy(update={"busy": 5, "held": 2, "heartbeat_age": w3.heartbeat_age})
    assert view.full_reads == 1 and len(snap) == 50


def test_new_and_changed_workers_arrive_incrementally(registry):
    registry.heartbeat_many([info(i) for i in range(10)])
    view = FleetView(registry)
    view.refresh()
    registry.heartbeat_many([info(42), info(2, zone="elsewhere")])
    snap = view.refresh()
    assert [w.id for w in snap] == sorted([f"w{i:03d}" for i in range(10)] + ["w042"])
    assert next(w for w in snap if w.id == "w002").zone == "elsewhere"
    assert view.full_reads == 1
    assert [w.model_dump(exclude={"heartbeat_age"}) for w in view.refresh()] == \
           [w.model_dump(exclude={"heartbeat_age"}) for w in registry.snapshot()]


def test_dead_workers_leave_and_come_back(fresh_fleet):
    client = fresh_fleet.client()
    try:
        reg = Registry(client, dead_after=0.5)
        fleet = [info(i) for i in range(5)]
        reg.heartbeat_many(fleet)
        view = FleetView(reg)
        assert len(view.refresh()) == 5

        def beat_all_but_one():
            reg.heartbeat_many(fleet[1:])
            return [w.id for w in view.refresh()] == [w.id for w in fleet[1:]]
        wait_until(beat_all_but_one, what="w000 to drop out")
        reg.heartbeat_many(fleet)
        assert [w.id for w in view.refresh()] == [w.id for w in fleet]
        assert view.full_reads == 1
    finally:
        client.close()


def test_a_worker_buried_without_a_version_bump_is_dropped(registry):
    registry.heartbeat_many([info(i) for i in range(6)])
    view = FleetView(registry)
    view.refresh()
    # What the janitor does to a dead worker: remove it from the zset and the full-record hash only.
    registry.client.zrem(keys.WORKERS, "w004")
    registry.client.hdel(keys.WORKERS_INFO, "w004")
    assert "w004" not in {w.id for w in view.refresh()}
    assert view.full_reads == 1
    registry.remove("w005")
    assert "w005" not in {w.id for w in view.refresh()}
    assert registry.client.hget(keys.WORKERS_STATIC, "w005") is None


def test_a_worker_of_an_older_gpulayer_still_shows_in_the_full_read(registry):
    registry.heartbeat(info(1))
    old = info(9, busy=1)
    sec, usec = registry.client.time()
    registry.client.zadd(keys.WORKERS, {old.id: sec + usec / 1e6})
    registry.client.hset(keys.WORKERS_INFO, old.id, old.model_dump_json())
    assert [w.id for w in registry.snapshot()] == ["w001", "w009"]
    assert [w.id for w in FleetView(registry).refresh()] == ["w001", "w009"]
    registry.client.set(keys.WORKERS_PACKED_SYNCED, "-1")  # a read that packs every record again...
    assert [w.id for w in registry.snapshot()] == ["w001", "w009"]
    assert registry.client.hget(keys.WORKERS_PACKED, "w001") is not None
    assert registry.client.hget(keys.WORKERS_PACKED, "w009") is None  # ...leaves it: nothing would say it went stale


def test_cached_snapshot_refreshes_incrementally_after_its_ttl(registry):
    registry.heartbeat_many([info(i) for i in range(3)])
    cache = CachedSnapshot(registry, ttl=60.0)
    first = cache.get()
    registry.heartbeat(info(7))
    assert cache.get() is first  # within the ttl
    cache.invalidate()
    assert [w.id for w in cache.get()] == ["w000", "w001", "w002", "w007"]
    assert cache._view.full_reads == 1
    cache.reset()
    assert len(cache.get()) == 4 and cache._view.full_reads == 1  # a new view: its first read


def test_current_is_exact_on_membership_and_load_and_reads_incrementally(registry):
    registry.heartbeat_many([info(i) for i in range(20)])
    assert [w.id for w in registry.current()] == [f"w{i:03d}" for i in range(20)]
    registry.heartbeat_many([info(3, busy=4), info(77)])
    registry.remove("w005")
    now = registry.current()
    assert {w.id for w in now} == {f"w{i:03d}" for i in range(20) if i != 5} | {"w077"}
    assert next(w for w in now if w.id == "w003").busy == 4
    assert registry._current.full_reads == 1


def test_a_load_change_keeps_the_snapshot_layout_and_a_new_worker_changes_it(registry):
    registry.heartbeat_many([info(i) for i in range(5)])
    view = FleetView(registry)
    first = view.refresh()
    registry.heartbeat(info(1, busy=3))
    second = view.refresh()
    assert second is not first and second.layout == first.layout and isinstance(second, tuple)
    registry.heartbeat(info(9))
    assert view.refresh().layout != first.layout


def test_cached_snapshot_refreshes_in_the_background_after_the_first_read(registry):
    registry.heartbeat_many([info(i) for i in range(3)])
    cache = CachedSnapshot(registry, ttl=2.0)
    assert len(cache.get()) == 3  # the first read happens before get returns
    registry.heartbeat(info(8))
    wait_until(lambda: len(cache.get()) == 4, what="the background refresh to bring w008")
    assert cache._view.full_reads == 1
    assert cache.get() is cache._view._value


def test_the_janitors_burial_leaves_no_registry_record_behind(registry):
    from gpulayer.worker.janitor import bury

    registry.heartbeat_many([info(i, busy=1) for i in range(3)])
    view = FleetView(registry)
    view.refresh()
    bury(None, registry.client, "w001", None, "no heartbeat for 5s", 3)  # nothing held: no Celery app needed
    r = registry.client
    assert [r.zscore(k, "w001") for k in (keys.WORKERS, keys.WORKERS_CHANGED, keys.WORKERS_LOAD_CHANGED)] == [None] * 3
    assert [r.hget(k, "w001") for k in (keys.WORKERS_INFO, keys.WORKERS_STATIC, keys.WORKERS_LOAD,
                                        keys.WORKERS_PACKED)] == [None] * 4
    assert [w.id for w in view.refresh()] == ["w000", "w002"] and view.full_reads == 1
    registry.heartbeat(info(1))  # the same worker, restarted: registered again in full
    assert [w.id for w in view.refresh()] == ["w000", "w001", "w002"]


def test_ages_of_named_workers_and_the_dead_by_redis_clock(registry):
    registry.heartbeat_many([info(i) for i in range(3)])
    secs, _ = registry.client.time()
    registry.client.zadd(keys.WORKERS, {"w002": secs - 60})
    ages = registry.ages(["w000", "w002", "never-seen"])
    assert set(ages) == {"w000", "w002"} and ages["w000"] < 5 < 59 < ages["w002"]
    assert set(registry.ages()) == {"w000", "w001", "w002"}
    assert set(registry.dead()) == {"w002"} and registry.dead()["w002"] >= 59


# --- the full read's packed records (store/packed.py) ---------------------------------------------

def _json_read(registry) -> tuple[WorkerInfo, ...]:
    """The full read as it is without packed records: every record from its JSON."""
    registry.client.set(keys.WORKERS_PACKED_SYNCED, "-1")  # out of sync: the read takes the JSON path
    return registry.snapshot()


def _same(a, b, fields_set=True) -> None:
    assert [w.model_dump(exclude={"heartbeat_age"}) for w in a] == [w.model_dump(exclude={"heartbeat_age"}) for w in b]
    if fields_set:
        assert [w.__pydantic_fields_set__ for w in a] == [w.__pydantic_fields_set__ for w in b]
    assert all(abs(x.heartbeat_age - y.heartbeat_age) < 1.0 for x, y in zip(a, b))


def test_the_packed_full_read_equals_the_json_one(registry):
    odd = [info(900, zone=None, region=None, gpu_names=()), info(901, gpus=2, gpu_names=("A100", "A100 80GB"),
                                                                  started_at=1764590000.123456, held=3),
           info(902, hostname="h\x1fsep"), info(903, zone=""), info(904, gpu_names=("",), gpus=1),
           info(905, id="with space é", hostname="hôte")]
    fleet = [info(i, busy=i % 8, held=i % 3) for i in range(30)] + odd
    registry.heartbeat_many(fleet)
    packed = registry.client.hgetall(keys.WORKERS_PACKED)
    assert b"w001" in packed and "with space é".encode() in packed
    assert not {b"w902", b"w903", b"w904"} & set(packed)  # values a packed record cannot tell apart: JSON
    fast = registry.snapshot()
    assert [w.id for w in fast] == sorted(w.id for w in fleet)
    _same(fast, _json_read(registry))
    _same(fast, sorted(fleet, key=lambda w: w.id), fields_set=False)
    assert fast[1].model_copy(update={"busy": 0}).busy == 0  # a record of the read is a model like any other


def test_a_write_of_an_older_gpulayer_puts_the_read_on_json_until_it_packs_everything_again(registry):
    registry.heartbeat_many([info(i, busy=1) for i in range(5)])
    before = registry.snapshot()
    # The previous gpulayer's heartbeat: static, load and version, no packed record.
    changed = info(2, busy=6, slots=16)
    r = registry.client
    r.hset(keys.WORKERS_STATIC, "w002", changed.model_dump_json(exclude={"busy", "held", "heartbeat_age"}))
    r.hset(keys.WORKERS_LOAD, "w002", "6 0")
    r.incr(keys.WORKERS_VERSION)
    assert r.hget(keys.WORKERS_PACKED, "w002").split(b"\x1f")[7] == b"8"  # stale: 8 slots
    got = {w.id: w for w in registry.snapshot()}
    assert (got["w002"].slots, got["w002"].busy) == (16, 6) and len(got) == len(before)
    assert r.get(keys.WORKERS_PACKED_SYNCED) == r.get(keys.WORKERS_VERSION)  # the read packed them again
    assert r.hget(keys.WORKERS_PACKED, "w002").split(b"\x1f")[7] == b"16"
    _same(registry.snapshot(), _json_read(registry))


@pytest.mark.parametrize("protocol", [3, 2])
def test_the_direct_full_read_equals_the_script_s_and_judges_the_dead_by_redis_clock(fresh_fleet, protocol):
    client = connect_redis(fresh_fleet.url, protocol=protocol)  # RESP3 sends scores as doubles, RESP2 as strings
    registry = Registry(client, dead_after=5.0)
    fleet = [info(i, busy=i % 8, held=i % 3) for i in range(40)] + [
        info(901, gpus=2, gpu_names=("A100", "A100 80GB"), started_at=1764590000.123456, held=3),
        info(905, id="with space é", hostname="hôte", zone=None, region=None)]
    registry.heartbeat_many(fleet)
    secs, _ = client.time()
    client.zadd(keys.WORKERS, {"w003": secs - 60, "w017": secs - 6})  # dead by Redis's clock, not yet removed
    version, direct = registry._read_packed()  # every live record packed and in sync: no script
    assert version == int(client.get(keys.WORKERS_VERSION))
    assert [w.id for w in direct] == sorted(w.id for w in fleet if w.id not in {"w003", "w017"})
    ages = {w.id: w.heartbeat_age for w in direct}
    assert all(0.0 <= a < 5.0 for a in ages.values())
    assert [w.id for w in registry.snapshot()] == [w.id for w in direct]
    _same(direct, _json_read(registry))
    _same(direct, sorted((w for w in fleet if w.id not in {"w003", "w017"}), key=lambda w: w.id), fields_set=False)
    # A live worker without a packed record: the script reads its JSON, and the read is whole again.
    registry.heartbeat_many(fleet)
    client.hdel(keys.WORKERS_PACKED, "w005")
    assert registry._read_packed() is None
    assert [w.id for w in registry.snapshot()] == sorted(w.id for w in fleet)
    client.close()
