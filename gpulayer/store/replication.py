"""What a Sentinel group's primary says of its replicas: who they are, whether they follow, how far behind.

``gpulayer status`` shows it for a ``sentinel://`` broker: a replica that lags or is not ``online`` is one a
failover now could promote with writes missing (README, "Sentinel").
"""

from __future__ import annotations

import re

import redis

_REPLICA = re.compile(r"slave\d+")


def replicas_of(info: dict) -> list[dict]:
    """The replicas in a primary's ``INFO replication`` (its ``slaveN`` entries: ip, port, state, offset, lag)."""
    return [v for k, v in sorted(info.items()) if _REPLICA.fullmatch(k) and isinstance(v, dict)]


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
    return {"group": group, "primary": f"{primary[0]}:{primary[1]}", "role": info.get("role"), "replicas": replicas}


def describe(report: dict) -> list[str]:
    """Lines: ``Sentinel group 'gpulayer': primary 127.0.0.1:6380``, what an acknowledged write means (its
    ``durability``), then ``  replica 127.0.0.1:6381 online, lag 0 s, 0 bytes behind`` for each replica."""
    head = f"Sentinel group {report['group']!r}: primary {report['primary']}"
    if report.get("role") != "master":
        head += f" (it says it is a {report.get('role')}: a failover is under way)"
    lines = [head]
    if report.get("durability") == "replicated":  # store/durability.py
        lines.append("  durability replicated: a write is acknowledged once a replica has it")
    elif report.get("durability"):
        lines.append("  durability local: a write is acknowledged by the primary alone (a failover may lose the last)")
    if not report["replicas"]:
        return [*lines, "  no replica follows it (a failover now would have nothing to promote)"]
    return [*lines, *(f"  replica {r['address']} {r['state']}, lag {r['lag_s']} s, {r['behind_bytes']} bytes behind"
                      for r in report["replicas"])]
