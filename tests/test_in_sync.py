"""Which replicas a replicated write waits for (store/in_sync.py, store/durability.py): pure units over a
primary's ``INFO replication`` as redis-py parses it. The same on real processes: tests/test_sentinel_degraded.py."""

from __future__ import annotations

import logging
import warnings

import pytest

from gpulayer import DurabilityDegraded
from gpulayer.store import durability, in_sync
from gpulayer.store.replication import describe


class Primary:
    """Stands in for a redis-py client of a primary: its ``INFO replication``, and how often it was read."""

    def __init__(self, *replicas: dict):
        self.replicas = list(replicas)
        self.reads = 0
        self.connection_pool = object()

    def info(self, section):
        assert section == "replication"
        self.reads += 1
        return {"role": "master", "connected_slaves": len(self.replicas),
                **{f"slave{i}": r for i, r in enumerate(self.replicas)}}


ONLINE = {"ip": "127.0.0.1", "port": 6381, "state": "online", "offset": 10, "lag": 0}


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for name in ("_cache", "_coming", "_none_since"):
        monkeypatch.setattr(in_sync, name, {})
    monkeypatch.setattr(durability, "_degraded", {})


def test_a_replica_counts_while_online_and_acknowledging():
    assert in_sync.count({"slave0": ONLINE}) == 1
    assert in_sync.count({"slave0": {**ONLINE, "lag": 11}}) == 0  # silent past min-replicas-max-lag: frozen
    assert in_sync.count({"slave0": {**ONLINE, "state": "wait_bgsave"}, "slave1": ONLINE}) == 1
    assert in_sync.count({"connected_slaves": 0}) == 0


def test_the_count_is_read_once_a_second_and_again_when_forgotten():
    primary = Primary(ONLINE)
    assert [in_sync.in_sync(primary) for _ in range(50)] == [1] * 50 and primary.reads == 1
    in_sync.forget(primary)
    primary.replicas = []
    assert in_sync.in_sync(primary) == 0 and primary.reads == 2
    assert in_sync.in_sync(primary, fresh=True) == 0 and primary.reads == 3


def test_with_no_replica_in_sync_a_write_goes_on_and_the_client_is_warned_once(caplog):
    waits = durability.Durability(1, 500)
    primary = Primary()
    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.WARNING, "gpulayer.store.durability"):
        warnings.simplefilter("always")
        assert [durability.planned(waits, primary) for _ in range(3)] == [durability.NONE] * 3
        durability.confirm(None, durability.NONE, "submit", ["a"], primary)  # nothing asked, nothing raised
        degraded = [w for w in seen if w.category is DurabilityDegraded]
        assert len(degraded) == 1 and "durability degraded: no replica" in str(degraded[0].message)
        assert degraded[0].filename == __file__  # shown at the line that wrote, not inside gpulayer
        assert durability.degraded()
        # A replica in sync again: the next write waits for it, and the log says so once.
        primary.replicas = [ONLINE]
        in_sync.forget(primary)
        assert durability.planned(waits, primary) == waits and not durability.degraded()
    assert caplog.text.count("durability replicated again") == 1


def test_min_replicas_waits_whatever_is_in_sync_and_a_miss_is_refused():
    from gpulayer.errors import NotReplicated

    strict = durability.Durability(1, 500, min_replicas=1)
    primary = Primary()
    assert durability.planned(strict, primary) == strict and primary.reads == 0  # no look needed
    with pytest.raises(NotReplicated) as err:
        durability.confirm(0, strict, "submit", ["a"])
    assert "min_replicas = 1" in str(err.value)


def test_a_miss_whose_replica_left_during_the_wait_is_degraded_not_refused():
    """The count said one replica (cached), the WAIT missed, and read again there is none: accepted, warned."""
    waits = durability.Durability(1, 500)
    primary = Primary(ONLINE)
    assert durability.planned(waits, primary) == waits
    primary.replicas = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        durability.confirm(0, waits, "submit", ["a"], primary)  # no NotReplicated
    assert [w.category for w in seen] == [DurabilityDegraded]


def test_a_worker_write_skips_the_wait_while_degraded_and_logs_it(caplog):
    waits = durability.Durability(1, 500)
    primary = Primary()
    with caplog.at_level(logging.WARNING, "gpulayer.store.durability"):
        assert not durability.worker_waits(waits, primary)
        assert not durability.worker_waits(waits, primary)
    assert caplog.text.count("durability degraded: no replica") == 1


def test_status_says_degraded_or_refused():
    report = {"group": "gpulayer", "primary": "127.0.0.1:6380", "role": "master", "replicas": [], "in_sync": 0,
              "durability": "replicated"}
    assert "  durability degraded: no replica in sync, so a write is acknowledged by the primary alone until one is " \
           "back (a failover now could lose the last writes)" in describe(report)
    assert any("min_replicas 1: 0 replica(s) in sync, so writes are refused" in line
               for line in describe({**report, "min_replicas": 1}))
    assert "  durability replicated: a write is acknowledged once a replica has it" in describe({**report,
                                                                                               "in_sync": 1})


class Sentinel:
    """Stands in for one sentinel of a group: the replicas it lists (redis-py's parse)."""

    def __init__(self, *replicas):
        self.replicas = list(replicas)

    def sentinel_slaves(self, service):
        return self.replicas


def listed(port, *flags):
    return {"ip": "127.0.0.1", "port": port, "runid": f"run-{port}", **{f"is_{f}": True for f in flags}}


class GroupPrimary(Primary):
    """A Sentinel group's primary: its pool names the group and its sentinels, as redis-py's does."""

    def __init__(self, sentinel, port=6380):
        super().__init__()
        self.run_id = f"run-{port}"
        self.connection_pool = type("Pool", (), {"service_name": "gpulayer",
                                                 "sentinel_manager": type("M", (), {"sentinels": [sentinel]})()})()

    def info(self, section):
        return {"run_id": self.run_id} if section == "server" else super().info(section)


def test_after_a_switch_a_write_waits_for_a_replica_the_sentinels_see_coming(monkeypatch):
    waits = durability.Durability(1, 500)
    # The promoted replica (this primary, 6380) is still listed as one (by a sentinel that has not heard of the
    # switch yet), and the other is up and linked: wait.
    sentinel = Sentinel(listed(6380), listed(6382))
    primary = GroupPrimary(sentinel)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DurabilityDegraded)
        assert durability.planned(waits, primary) == waits
    # Only this primary and the lost old one left (unreachable, then down): degraded at once.
    monkeypatch.setattr(in_sync, "_coming", {})
    sentinel.replicas = [listed(6380), listed(6381, "disconnected"), listed(6382, "sdown", "disconnected")]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert durability.planned(waits, primary) == durability.NONE
    assert [w.category for w in seen] == [DurabilityDegraded]


def test_a_replica_coming_is_waited_for_only_so_long(monkeypatch):
    primary = GroupPrimary(Sentinel(listed(6382)))
    assert in_sync.coming(primary)
    key = in_sync._key(primary)
    monkeypatch.setitem(in_sync._none_since, key, in_sync._none_since[key] - in_sync.COMING_GRACE)
    assert not in_sync.coming(primary)  # it never came in sync: go on degraded
