"""What a Sentinel group's primary says of its replicas: who they are, whether they follow, how far behind.

``gpulayer status`` shows it for a ``sentinel://`` broker: a replica that lags or is not ``online`` is one a
failover now could promote with writes missing (docs/RELIABILITY.md, "Sentinel").
"""

from __future__ import annotations

import re

import redis

_REPLICA = re.compile(r"slave\d+")
# Seconds since a replica's last acknowledgement (replicas send one every second) past which it is not waited
# for: Redis's own min-replicas-max-lag default. A frozen replica still looks connected until then.
MAX_LAG = 10


def replicas_of(info: dict) -> list[dict]:
    """The replicas in a primary's ``INFO replication`` (its ``slaveN`` entries: ip, port, state, offset, lag)."""
    return [v for k, v in sorted(info.items()) if _REPLICA.fullmatch(k) and isinstance(v, dict)]


def in_sync_count(info: dict) -> int:
    """Replicas in ``info`` that are ``online`` and acknowledged within ``MAX_LAG`` seconds: those a replicated
    write waits for (store/in_sync.py)."""
    return sum(1 for r in replicas_of(info) if r.get("state") == "online" and int(r.get("lag", 0)) <= MAX_LAG)


def caught_up(info: dict, offset: int) -> int:
    """How many replicas in ``info`` are online and have the primary's stream up to ``offset``."""
    return sum(1 for r in replicas_of(info) if r.get("state") == "online" and int(r.get("offset", -1)) >= offset)


def replication(client: redis.Redis, group: str | None = None) -> dict:
    """``{"group", "primary", "role", "replicas": [{"address", "state", "lag_s", "behind_bytes"}]}`` from the
    server ``client`` reaches (the primary, for a client of ``store.sentinel.sentinel_pool``)."""
    info = client.info("replication")
    pool = client.connection_pool
    primary = getattr(pool, "master_address", None) or (pool.connection_kwargs.get("host"),
                                                         pool.connection_kwargs.get("port"))
    offset = int(info.get("master_repl_offset", 0))
    replicas = [{"address": f"{v.get('ip')}:{v.get('port')}", "state": v.get("state"), "lag_s": v.get("lag"),
                 "behind_bytes": max(0, offset - int(v.get("offset", 0)))}
                for v in replicas_of(info)]
    return {"group": group, "primary": f"{primary[0]}:{primary[1]}", "role": info.get("role"), "replicas": replicas,
            "in_sync": in_sync_count(info)}


def describe(report: dict) -> list[str]:
    """Lines: ``Sentinel group 'gpulayer': primary 127.0.0.1:6380``, what an acknowledged write means (its
    ``durability`` and ``min_replicas``; "degraded" while no replica is in sync), then ``  replica 127.0.0.1:6381 online, lag 0 s, 0 bytes behind`` for each replica."""
    head = f"Sentinel group {report['group']!r}: primary {report['primary']}"
    if report.get("role") != "master":
        head += f" (it says it is a {report.get('role')}: a failover is under way)"
    lines = [head]
    floor = report.get("min_replicas") or 0
    if report.get("durability") == "replicated" and report.get("in_sync", 1) < max(floor, 1):  # store/durability.py
        if floor:
            lines.append(f"  durability replicated, min_replicas {floor}: {report.get('in_sync', 0)} replica(s) in "
                         "sync, so writes are refused (NotReplicated) until enough are back")
        else:
            lines.append("  durability degraded: no replica in sync, so a write is acknowledged by the primary "
                         "alone until one is back (a failover now could lose the last writes)")
    elif report.get("durability") == "replicated":
        lines.append("  durability replicated: a write is acknowledged once a replica has it"
                     + (f" (min_replicas {floor}: refused when fewer confirm)" if floor else ""))
    elif report.get("durability"):
        lines.append("  durability local: a write is acknowledged by the primary alone (a failover may lose the last)")
    if not report["replicas"]:
        return [*lines, "  no replica follows it (a failover now would have nothing to promote)"]
    return [*lines, *(f"  replica {r['address']} {r['state']}, lag {r['lag_s']} s, {r['behind_bytes']} bytes behind"
                      for r in report["replicas"])]
