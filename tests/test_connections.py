"""How many Redis connections a real worker holds, counted by ``CLIENT LIST`` (issue 14: a control plane
with a budget). Redis's default ``maxclients`` is 10,000, so each connection per worker is a fleet-size limit.

A worker holds, by name (``gpulayer:<worker>:<use>``):
- ``celery`` x4: kombu's: the task consumer's blocking take, the control mailbox's pattern
  subscription, and two for their other commands; Celery's event dispatcher opens its own only once
  a monitor turns events on (engine/events.py);
- ``worker``: registry checks and the janitor, one connection shared by both;
- ``heartbeat``: the heartbeat's own (behind the janitor's commands on a starved host it waited
  seconds, and live workers were judged dead);
- ``gang-agent`` and ``control``: a blocking read each (gang orders; the coordinator's queue);
- ``reaper``: the cancel channel's subscription;
- ``results`` x1 per pool process that has stored a result itself: a failure, a result over 64 KiB, or a
  job in a chord or chain. A small success goes back to the main process unstored, which stores it with
  the job's ack on its ``celery`` connection (engine/results.py, ``StoreLater``).
"""

from __future__ import annotations

import time

from gpulayer import Resources, submit

from .fleets import running_fleet

IDLE = 9  # the main process's connections, above
# The user table's reads (app._users_client_name): one connection per process holding the secret, the main
# process and each pool process; not yet shared with another of the process's connections (issue 45).
SLOTS = {"w-one": 1, "w-four": 4}


def test_a_worker_holds_nine_connections_and_one_per_pool_process_that_stored_a_result_itself(tmp_path):
    with running_fleet(tmp_path, {"w-one": {"slots": 1}, "w-four": {"slots": 4}}, connect=True,
                       torch=False) as fleet:
        # The jobs carry no shipped code: a pool process that unpacks an archive reads it from Redis once
        # (gpulayer/workspace/cache.py), which is counted here no more than a result it stores itself.
        assert submit.s(abs, -1, resources=Resources(worker_ids=["w-one"])).apply_async(
            working_dir=False).get(timeout=60) == 1
        jobs = [submit.s(time.sleep, 1.0, resources=Resources(worker_ids=["w-four"])).apply_async(working_dir=False)
                for _ in range(4)]
        for job in jobs:
            job.get(timeout=60)
        for name in ("w-one", "w-four"):  # successes only: their pool processes never connected
            names = sorted(c["name"] for c in fleet.connections(name))
            users = names.count(f"gpulayer:{name}:users")
            assert users <= 1 + SLOTS[name] and len(names) - users <= IDLE, (name, ", ".join(names))
            assert all(n.startswith(f"gpulayer:{name}:") for n in names), names
            assert names.count(f"gpulayer:{name}:worker") == 1, names  # registry checks and janitor share one
            assert names.count(f"gpulayer:{name}:heartbeat") == 1, names
            assert f"gpulayer:{name}:results" not in names, names
        failed = submit.s(divmod, 1, 0, resources=Resources(worker_ids=["w-one"])).apply_async(working_dir=False)
        assert failed.get(timeout=60, propagate=False) is not None and failed.failed()
        names = sorted(c["name"] for c in fleet.connections("w-one"))
        assert len(names) - names.count("gpulayer:w-one:users") <= IDLE + 1, names
        assert "gpulayer:w-one:results" in names, names  # the failure's store: the count sees pool processes too


# Where gpulayer may build a redis-py client itself, each with the reason; everywhere else goes through
# store/connection.py's connect_redis (TLS options, Sentinel groups, client names, one connection per client).
RAW_CLIENTS = {
    "gpulayer/store/connection.py": "the one way to connect",
    "gpulayer/engine/sentinel.py": "the switch watch asks each sentinel itself, with the group's sentinel password",
}


def test_every_redis_client_comes_from_the_one_connection_factory():
    import ast
    from pathlib import Path

    import gpulayer

    package = Path(gpulayer.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel in RAW_CLIENTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                if func.split(".")[-1] in ("Redis", "StrictRedis") or func.endswith(("Redis.from_url",
                                                                                         "StrictRedis.from_url")):
                    found.append(f"{rel}:{node.lineno}: {func}(...)")
    assert not found, ("redis-py clients built outside gpulayer/store/connection.py (use connect_redis): "
                       + "; ".join(found))
