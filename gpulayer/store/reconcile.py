"""Reconciliation after a broker failover: the new primary may lack the old one's last writes.

Redis replicates asynchronously, so a promoted replica can lack a reservation, a release, a gang's record or a
heartbeat the old primary acknowledged. The slot ledger must never double-book, so:

- every worker names the primary it talks to by its *epoch* (:func:`primary_epoch`: run id and replication id,
  both new after a promotion or a restart) and, on each heartbeat that finds a new one, re-asserts what it runs
  from its own process (``reassert.lua``: its ledger entry, the gang nodes it claims), marking it done
  (``keys.RECONCILED``);
- the coordinator places nothing while a live worker's mark names another epoch (:func:`late`), for up to
  ``RECONCILE_WAIT`` seconds after the switch, and then nothing on those workers;
- the janitor and the gang agents judge no worker dead for ``worker_dead_after`` seconds after a switch
  (:func:`switched_within`): the heartbeats on the new primary are as old as the failover, not the workers' silence.

A worker that never re-asserted on any primary (an emulated one, an older gpulayer) has no mark and is never late.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import redis

from . import keys
from .registry import load_script

# Seconds the coordinator waits, after a switch, for every live worker to re-assert before it places gangs on
# the workers that have (each re-asserts on its first heartbeat on the new primary: about a second).
RECONCILE_WAIT = 10.0


def primary_epoch(client: redis.Redis) -> str:
    """``"<run id>:<replication id>"`` of the server ``client`` reaches: the same until it restarts or is
    promoted (a replica made primary gets a new replication id), whichever server of a group it is."""
    # Two INFO sections in one round trip; not ``INFO server replication``, which Redis before 7 refuses (the
    # embedded cluster may run the pip-installed redis-server 6.2).
    pipe = client.pipeline(transaction=False)
    pipe.info("server")
    pipe.info("replication")
    server, replication = pipe.execute()
    return f"{server.get('run_id', '')}:{replication.get('master_replid', '')}"


def node_id(gang_id: str, attempt: int, node: int) -> str:
    """How a gang node is named in the claims and in ``reassert.lua``."""
    return f"{gang_id} {int(attempt)} {int(node)}"


def reassert(client: redis.Redis, worker_id: str, epoch: str, held: int, running: Iterable[str],
             taken: Iterable[str]) -> int:
    """Write ``worker_id``'s ledger entry and claims for ``epoch`` (see ``reassert.lua``); the slots it holds."""
    script = load_script(client, "reassert")
    out = script(keys=[keys.SLOTS_HELD, keys.agent_orders(worker_id), keys.RECONCILED, keys.RECONCILED_CLAIMS,
                       keys.PRIMARY_SEEN],
                 args=[worker_id, epoch, int(held), json.dumps(list(running)), *taken])
    return int(out)


def epoch_age(client: redis.Redis, epoch: str) -> float:
    """Seconds (Redis's clock) since a gpulayer process first saw this server as the primary; 0 the first time
    (it is noted now)."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.hget(keys.PRIMARY_SEEN, epoch)
    (secs, micros), seen = pipe.execute()
    now = secs + micros / 1e6
    if seen is None:
        client.hsetnx(keys.PRIMARY_SEEN, epoch, f"{now:.6f}")
        return 0.0
    return max(0.0, now - float(seen))


def switched_within(client: redis.Redis, seconds: float) -> float | None:
    """The seconds since this primary was first seen, when under ``seconds`` and the cluster had another primary
    before it (a failover, or a restart from its files); else None. A cluster's first primary never switched."""
    epoch = primary_epoch(client)
    age = epoch_age(client, epoch)
    if age >= seconds or client.hlen(keys.PRIMARY_SEEN) < 2:
        return None
    return age


def late(client: redis.Redis, epoch: str, worker_ids: Iterable[str]) -> list[str]:
    """The workers among ``worker_ids`` (the live ones) that re-asserted on another primary and not yet on
    ``epoch``, sorted. One read of the marks: its cost follows the workers that re-assert, not the fleet."""
    marks = client.hgetall(keys.RECONCILED)
    if not marks:
        return []
    live = set(worker_ids)
    return sorted(w for w, mark in ((k.decode(), v.decode()) for k, v in marks.items()) if w in live and mark != epoch)


def claims(client: redis.Redis) -> tuple[dict[str, str], dict[str, set[str]]]:
    """``(epoch each worker re-asserted on, the gang nodes each claimed there)``."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.RECONCILED)
    pipe.hgetall(keys.RECONCILED_CLAIMS)
    marks, raw = pipe.execute()
    return ({k.decode(): v.decode() for k, v in marks.items()},
            {k.decode(): set(json.loads(v) or []) for k, v in raw.items()})


def forget(client: redis.Redis, worker_id: str) -> None:
    """A worker gone for good (buried, or stopped) has nothing to re-assert."""
    pipe = client.pipeline(transaction=False)
    pipe.hdel(keys.RECONCILED, worker_id)
    pipe.hdel(keys.RECONCILED_CLAIMS, worker_id)
    pipe.execute()

