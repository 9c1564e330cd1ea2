"""Each host's cache of remote objects: one fetch per host however many processes ask, bounded, oldest out first."""

from __future__ import annotations

import multiprocessing
import os
import time

from gpulayer.objects.cache import HostCache, cache_for_store

OIDS = [f"{i:032x}" for i in range(5)]


def _fetch_in_child(root: str, log: str) -> None:
    def fetch(tmp):
        with open(log, "a") as f:
            f.write("fetch\n")
        time.sleep(0.3)  # the others arrive meanwhile
        tmp.write_bytes(b"x" * 1000)

    path = HostCache(root, 10_000).path(OIDS[0], 1000, fetch)
    assert path.read_bytes() == b"x" * 1000


def test_processes_of_a_host_fetch_an_object_once(tmp_path):
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_fetch_in_child, args=(str(tmp_path / "cache"), str(log))) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert log.read_text() == "fetch\n"
    assert sorted(os.listdir(tmp_path / "cache")) == [OIDS[0]]  # no lock or temporary file left


def test_the_least_recently_used_copies_go_first(tmp_path):
    cache = HostCache(tmp_path / "cache", 3000)
    for i, oid in enumerate(OIDS[:3]):
        cache.path(oid, 1000, lambda tmp: tmp.write_bytes(b"y" * 1000))
        os.utime(cache.root / oid, (1000 + i, 1000 + i))
    cache.path(OIDS[0], 1000, lambda tmp: (_ for _ in ()).throw(AssertionError("fetched again")))  # used now
    cache.path(OIDS[3], 1000, lambda tmp: tmp.write_bytes(b"z" * 1000))
    assert sorted(os.listdir(cache.root)) == sorted([OIDS[0], OIDS[2], OIDS[3]])  # OIDS[1] was the oldest


def test_a_cache_per_store_url():
    a, b = cache_for_store("s3://bucket/a"), cache_for_store("s3://bucket/b")
    assert a is cache_for_store("s3://bucket/a") and a.root != b.root and a.limit >= 2**30
