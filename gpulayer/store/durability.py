"""What an acknowledgement means: a write confirmed by the primary alone, or by a replica too (Redis ``WAIT``).

``durability = "replicated"`` (the default for a ``sentinel://`` broker): each write that hands something over
(a ``submit``'s publish, a ``submit_batch`` chunk, a gang's reservation, a job's result, the script that acks
finished jobs) is followed, on the same connection, by ``WAIT 1 <timeout ms>``: its caller goes on only once
a replica has it, so a failover right after cannot lose it. ``"local"`` (the default for one Redis): no
``WAIT``, Redis' own acknowledgement (async replication, if any).

When no replica confirms within ``durability_timeout`` seconds:

- a client's call (``delay``, ``apply_async``, ``submit_batch``) raises :class:`~gpulayer.errors.NotReplicated`
  naming the jobs: they are on the primary and will most likely run, but may not survive a failover now;
  sending them again with the same job ids is safe (a job runs again at most, its result is stored once).
  Within ``SWITCH_WAIT`` seconds of a failover the call first waits for the new primary's replicas to
  re-attach and catch up (:func:`caught_up_after_switch`), so a failover makes it slower, not fail;
- a worker's write (a result, an ack, a reservation) is logged and the worker carries on: delivery at least
  once covers it (a lost ack or result reruns the job). That worker then stops waiting for
  ``PAUSE_AFTER_MISS`` seconds, so a replica that hangs costs each worker one wait, not one per take.

The wire form travels in the Celery app's transport options (``OPTION``), so the transport, the result
backend and the coordinator of every process read the same setting.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from time import monotonic, sleep

import redis

from ..errors import NotReplicated
from .replication import caught_up

log = logging.getLogger(__name__)

OPTION = "gpulayer_durability"  # broker_transport_options key: (replicas, timeout ms); absent for "local"
PAUSE_AFTER_MISS = 10.0  # seconds a worker writes without WAIT after one went unconfirmed
# Seconds after a switch during which a client's unconfirmed write waits for the new primary's replicas rather
# than raising: a returning old primary is demoted by the sentinels only once it has answered as a primary for
# 8 s (Sentinel's rule against flapping), then resyncs; a group of one replica has none until then.
SWITCH_WAIT = 20.0
REPLICAS = 1  # how many replicas must confirm


@dataclass(frozen=True)
class Durability:
    """``WAIT <replicas> <timeout_ms>`` after each acknowledged write; ``replicas`` 0: none ("local")."""

    replicas: int = 0
    timeout_ms: int = 0

    def __bool__(self) -> bool:
        return self.replicas > 0

    def command(self) -> tuple:
        return "WAIT", self.replicas, self.timeout_ms


NONE = Durability()


def to_options(replicated: bool, timeout: float) -> dict:
    """The transport options that carry the setting (none for "local")."""
    return {OPTION: [REPLICAS, max(1, round(timeout * 1000))]} if replicated else {}


def from_options(options: dict | None) -> Durability:
    value = (options or {}).get(OPTION)
    return Durability(int(value[0]), int(value[1])) if value else NONE


# -- after the write: the client's call raises, a worker's logs and carries on ----------------------------------
def confirm(acked, durability: Durability, what: str, job_ids=(), client: redis.Redis | None = None) -> None:
    """A client's write: raise :class:`NotReplicated` when fewer replicas than asked confirmed it.

    Right after a failover the new primary's replicas are still re-attaching (the sentinels point them at it
    one after the other): with ``client`` (the primary the write went to), a miss within ``SWITCH_WAIT``
    seconds of a switch waits, until that window ends, for a replica to report the primary's offset read after
    the write, rather than failing the call a failover made slow."""
    if not durability or int(acked) >= durability.replicas:
        return
    if client is not None and caught_up_after_switch(client, durability):
        return
    ids = tuple(job_ids)
    named = (f"job {ids[0]}" if len(ids) == 1 else f"{len(ids)} jobs (first {ids[0]})") if ids else "the write"
    raise NotReplicated(
        f"{what}: {named} reached the broker's primary, but no replica confirmed it within "
        f"{durability.timeout_ms / 1000:g} s (durability = \"replicated\"), so it may not survive a failover now; "
        "sending it again with the same job id is safe (a job runs again at most, its result is stored once). "
        "`gpulayer status` shows the replicas' state; GPULAYER_DURABILITY=local stops waiting for them", ids)


def caught_up_after_switch(client: redis.Redis, durability: Durability, poll: float = 0.1) -> bool:
    """When the primary ``client`` reaches switched under ``SWITCH_WAIT`` seconds ago: wait, until then, for
    ``durability.replicas`` replicas online at or past its replication offset now (which covers a write made
    before this call on any connection: one stream, in order); whether they got there. False at once otherwise."""
    from .reconcile import switched_within

    try:
        age = switched_within(client, SWITCH_WAIT)
        if age is None:
            return False
        deadline = monotonic() + SWITCH_WAIT - age
        info = client.info("replication")
        target = int(info.get("master_repl_offset", 0))
        if caught_up(info, target) >= durability.replicas:
            return True
        log.warning("gpulayer: the broker failed over %.1f s ago and no replica of the new primary has confirmed "
                    "this write yet; waiting up to %.0f s for one to catch up (durability \"replicated\")",
                    age, SWITCH_WAIT - age)
        while caught_up(info, target) < durability.replicas:
            if monotonic() >= deadline:
                return False
            sleep(poll)
            info = client.info("replication")
        return True
    except redis.exceptions.RedisError as err:  # the primary went away too: the call's own error says enough
        log.debug("gpulayer: waiting for replicas after a switch: %s", err)
        return False


_paused_until: dict[int, float] = {}  # pid -> until when this process's worker writes skip WAIT
_paused_lock = threading.Lock()


def worker_waits(durability: Durability) -> bool:
    """Should a worker's write wait for a replica now (durability on, and no recent miss in this process)?"""
    return bool(durability) and monotonic() >= _paused_until.get(os.getpid(), 0.0)


def worker_confirm(acked, durability: Durability, what: str) -> bool:
    """A worker's write: log a miss (and pause waits for ``PAUSE_AFTER_MISS``); whether a replica confirmed it."""
    if int(acked) >= durability.replicas:
        return True
    with _paused_lock:
        _paused_until[os.getpid()] = monotonic() + PAUSE_AFTER_MISS
    log.warning("gpulayer: %s reached the primary but no replica confirmed it within %g s: a failover now could "
                "lose it (the job then runs again); carrying on, without waiting for replicas for %g s",
                what, durability.timeout_ms / 1000, PAUSE_AFTER_MISS)
    return False


def call_script(client: redis.Redis, script, keys: list, args: list, durability: Durability):
    """``script(keys, args)``, then ``WAIT`` on the same connection: ``(reply, replicas that confirmed)``;
    ``(reply, None)`` without ``durability`` (one command, as before)."""
    if not durability:
        return script(keys=keys, args=args), None
    for attempt in (1, 2):
        with client.pipeline(transaction=False) as pipe:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command(*durability.command())
            try:
                reply, acked = pipe.execute()
                return reply, acked
            except redis.exceptions.NoScriptError:  # a new (or flushed) server: load it, then again
                if attempt == 2:
                    raise
                client.script_load(script.script)
