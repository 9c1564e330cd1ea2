"""Queue names: the one place they are built.

Each name is also the Redis list key kombu's Redis transport keeps the queue
in, so every name starts with the namespace of ``store/keys.py``.

A worker consumes the queues of what it can do:

- ``gl.q.cpu``, ``gl.q.cpu.z.<zone>``, ``gl.q.cpu.r.<region>``: every worker;
- ``gl.q.cuda<k>``, ``...cuda<k>.z.<zone>``, ``...cuda<k>.r.<region>`` for
  k = 1..G on a worker with G GPUs: a job asking for k GPUs per process goes
  to ``cuda<k>``, which only workers with at least k GPUs read;
- ``gl.q.w.<worker id>``: its private queue, for pinned work.

Beside them, every worker serves ``gl.q.control`` outside its job slots: the
gang coordinator's messages (``gpulayer/gang/consumer.py``), never a user's job.
"""

from __future__ import annotations

from .store.keys import NAMESPACE

_Q = f"{NAMESPACE}.q"


def capability(gpus: int = 0, zone: str | None = None, region: str | None = None) -> str:
    """The shared queue for jobs needing ``gpus`` GPUs (0 = CPU) in ``zone`` or ``region``."""
    base = f"{_Q}.cuda{gpus}" if gpus > 0 else f"{_Q}.cpu"
    if zone:
        return f"{base}.z.{zone}"
    if region:
        return f"{base}.r.{region}"
    return base


def private(worker_id: str) -> str:
    """A worker's own queue: pinned jobs and gang orders."""
    return f"{_Q}.w.{worker_id}"


def for_worker(worker_id: str, gpus: int, zone: str | None, region: str | None) -> list[str]:
    """Every queue a worker with these capabilities consumes, private queue first."""
    names = [private(worker_id)]
    for k in range(0, gpus + 1):
        names.append(capability(k))
        if zone:
            names.append(capability(k, zone=zone))
        if region:
            names.append(capability(k, region=region))
    return names


DEFAULT = capability()
CONTROL = f"{_Q}.control"  # the coordinator's queue: read by every worker's control consumer, not by its pool
