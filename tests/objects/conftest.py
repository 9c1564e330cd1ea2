"""A Redis of its own (``fresh_fleet``: Redis only, no workers), this process connected to it, and the object
store in the test's own directory."""

from __future__ import annotations

import pytest


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def cluster(fresh_fleet, store_dir, monkeypatch):
    monkeypatch.setenv("GPULAYER_OBJECT_STORE", str(store_dir))
    fresh_fleet.connect()
    return fresh_fleet


@pytest.fixture
def client(cluster):
    c = cluster.client()
    yield c
    c.close()
