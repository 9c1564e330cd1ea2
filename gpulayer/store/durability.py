"""What an acknowledgement means: a write confirmed by the primary alone, or by a replica too (Redis ``WAIT``).

``durability = "replicated"`` (the default for a ``sentinel://`` broker): each write that hands something over
(a ``submit``'s publish, a ``submit_batch`` chunk, a gang's reservation, a job's result, the script that acks
finished jobs) is followed, on the same connection, by ``WAIT 1 <timeout ms>``: its caller goes on only once
a replica has it, so a failover right after cannot lose it. ``"local"`` (the default for one Redis): no
``WAIT``, Redis' own acknowledgement (async replication, if any).

Which replicas a write waits for (store/in_sync.py): one of those connected to the primary and in sync. When
none is (the group lost its only replica; a failover promoted it and the old primary is gone for good), writes
go on, acknowledged by the primary alone: durability is *degraded* until a replica is back in sync. A client
is told once with a :class:`~gpulayer.errors.DurabilityDegraded` warning, a worker logs "durability degraded:
no replica" once and again when one is back, and ``gpulayer status`` says so. ``min_replicas`` (default 0;
``durability = "strict"`` is ``min_replicas = 1``) keeps the refusal instead: every write waits for that many
replicas, in sync or not.

When a replica that was waited for does not confirm within ``durability_timeout`` seconds (it hangs, or
``min_replicas`` asks for more replicas than are in sync):

- a client's call (``delay``, ``apply_async``, ``submit_batch``) raises :class:`~gpulayer.errors.NotReplicated`
  naming the jobs: they are on the primary and will most likely run, but may not survive a failover now;
  sending them again with the same job ids is safe (a job runs again at most, its result is stored once).
  Within ``SWITCH_WAIT`` seconds of a failover the call first waits for the new primary's replicas to
  re-attach and catch up (:func:`caught_up_after_switch`), so a failover makes it slower, not fail;
- a worker's write (a result, an ack, a reservation) is logged and the worker carries on: delivery at least
  once covers it (a lost ack or result reruns the job). That worker then stops waiting for
  ``PAUSE_AFTER_MISS`` seconds, so a replica that hangs costs each worker one wait, not one per take.

With ``min_replicas = 0`` a miss whose replica is no longer in sync (read again at once) is degradation, not
a refusal: the write is accepted as above.

The wire form travels in the Celery app's transport options (``OPTION``), so the transport, the result
backend and the coordinator of every process read the same setting.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from time import monotonic, sleep

import redis

from ..errors import DurabilityDegraded, NotReplicated
from .in_sync import coming, in_sync
from .replication import caught_up

log = logging.getLogger(__name__)

OPTION = "gpulayer_durability"  # broker_transport_options key: (replicas, timeout ms, min replicas); absent: "local"
PAUSE_AFTER_MISS = 10.0  # seconds a worker writes without WAIT after one went unconfirmed
# Seconds after a switch during which a client's unconfirmed write waits for the new primary's replicas rather
# than raising: a returning old primary is demoted by the sentinels only once it has answered as a primary for
# 8 s (Sentinel's rule against flapping), then resyncs; a group of one replica has none until then.
SWITCH_WAIT = 20.0
REPLICAS = 1  # how many replicas a write waits for while one is in sync (min_replicas, if more)


@dataclass(frozen=True)
class Durability:
    """``WAIT <replicas> <timeout_ms>`` after each acknowledged write; ``replicas`` 0: none ("local").
    ``min_replicas`` 0: no wait while no replica is in sync (degraded); more: always wait, and refuse a miss."""

    replicas: int = 0
    timeout_ms: int = 0
    min_replicas: int = 0

    def __bool__(self) -> bool:
        return self.replicas > 0

    def command(self) -> tuple:
        return "WAIT", self.replicas, self.timeout_ms


NONE = Durability()


def to_options(replicated: bool, timeout: float, min_replicas: int = 0) -> dict:
    """The transport options that carry the setting (none for "local")."""
    if not replicated:
        return {}
    return {OPTION: [max(REPLICAS, min_replicas), max(1, round(timeout * 1000)), min_replicas]}


def from_options(options: dict | None) -> Durability:
    value = (options or {}).get(OPTION)
    if not value:
        return NONE
    # (replicas, timeout ms) from a gpulayer before min_replicas: it refused every miss
    return Durability(int(value[0]), int(value[1]), int(value[2]) if len(value) > 2 else int(value[0]))


# -- before the write: wait for a replica in sync, or go on degraded --------------------------------------------
_degraded: dict[int, bool] = {}  # pid -> this process found no replica in sync at its last look
_degraded_lock = threading.Lock()


def planned(durability: Durability, client: redis.Redis | None, warn: bool = True) -> Durability:
    """What a write to the primary ``client`` reaches waits for: ``durability``, or ``NONE`` when it lets writes go
    on without a replica (``min_replicas`` 0) and none is in sync (read at most once a second). ``warn``: a
    client's call (a :class:`DurabilityDegraded` warning); else a worker's (a log line)."""
    if not durability or durability.min_replicas > 0 or client is None:
        return durability
    n = in_sync(client)
    if n:
        note_in_sync(client)
    if n is None or n > 0 or coming(client):  # (a failover's other replicas re-attaching: wait for them)
        return durability
    note_degraded(client, warn)
    return NONE


def note_degraded(client: redis.Redis | None, warn: bool) -> None:
    """No replica is in sync: say so once per episode (a client's warning, a worker's log line)."""
    with _degraded_lock:
        if _degraded.get(os.getpid()):
            return
        _degraded[os.getpid()] = True
    where = _address(client)
    text = (f"durability degraded: no replica of the broker's primary{where} is in sync, so writes are "
            "acknowledged by the primary alone until one is back (a failover now could lose the last of them); "
            "`gpulayer status` shows the replicas; min_replicas = 1 refuses such writes instead")
    if warn:  # a client's: one warning, shown at the user's line that made the write
        warnings.warn(DurabilityDegraded(text), stacklevel=_callers_level())
    else:
        log.warning("gpulayer: %s", text)


_ENGINE = ("gpulayer", "celery", "kombu", "redis")  # packages a client's write passes through


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside gpulayer and the engine under it (this one's caller's, if
    all of the stack is theirs)."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _ENGINE:
        frame, level = frame.f_back, level + 1
    return level


def note_in_sync(client: redis.Redis | None) -> None:
    """A replica is in sync again after :func:`note_degraded`: say so once."""
    if not _degraded.get(os.getpid()):
        return
    with _degraded_lock:
        if not _degraded.pop(os.getpid(), None):
            return
    log.warning("gpulayer: durability replicated again: a replica of the broker's primary%s is in sync, so a "
                "write is acknowledged once it has it", _address(client))


def degraded() -> bool:
    """Did this process find no replica in sync at its last look (durability degraded)?"""
    return bool(_degraded.get(os.getpid()))


def _address(client: redis.Redis | None) -> str:
    """`` (Sentinel group 'gpulayer')`` or `` 127.0.0.1:6380``: which primary, for a message."""
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service:
        return f" (Sentinel group {service!r})"
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    return f" {kwargs['host']}:{kwargs.get('port')}" if kwargs.get("host") else ""


def _gone(durability: Durability, client: redis.Redis | None, warn: bool) -> bool:
    """A miss of a write that lets durability degrade (``min_replicas`` 0), read again at once: no replica is in
    sync any more (it went away during the wait), so the write is accepted as degraded."""
    if durability.min_replicas > 0 or client is None or in_sync(client, fresh=True) != 0 or coming(client):
        return False
    note_degraded(client, warn)
    return True


# -- after the write: the client's call raises, a worker's logs and carries on ----------------------------------
def confirm(acked, durability: Durability, what: str, job_ids=(), client: redis.Redis | None = None) -> None:
    """A client's write: raise :class:`NotReplicated` when fewer replicas than asked confirmed it (``durability``:
    what :func:`planned` said it waits for).

    Right after a failover the new primary's replicas are still re-attaching (the sentinels point them at it
    one after the other): with ``client`` (the primary the write went to), a miss within ``SWITCH_WAIT``
    seconds of a switch waits, until that window ends, for a replica to report the primary's offset read after
    the write, rather than failing the call a failover made slow."""
    if not durability or acked is None or int(acked) >= durability.replicas:
        return
    if _gone(durability, client, warn=True):
        return
    if client is not None and caught_up_after_switch(client, durability):
        return
    ids = tuple(job_ids)
    named = (f"job {ids[0]}" if len(ids) == 1 else f"{len(ids)} jobs (first {ids[0]})") if ids else "the write"
    floor = (f"; min_replicas = {durability.min_replicas} refuses a write fewer replicas confirmed (0: writes go "
             "on while no replica is in sync)") if durability.min_replicas else ""
    raise NotReplicated(
        f"{what}: {named} reached the broker's primary, but no replica confirmed it within "
        f"{durability.timeout_ms / 1000:g} s (durability = \"replicated\"), so it may not survive a failover now; "
        "sending it again with the same job id is safe (a job runs again at most, its result is stored once). "
        f"`gpulayer status` shows the replicas' state; GPULAYER_DURABILITY=local stops waiting for them{floor}", ids)


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


def worker_waits(durability: Durability, client: redis.Redis | None = None) -> bool:
    """Should a worker's write to the primary ``client`` reaches wait for a replica now (durability on, a replica
    in sync or ``min_replicas`` asking, and no recent miss in this process)?"""
    return (bool(durability) and monotonic() >= _paused_until.get(os.getpid(), 0.0)
            and bool(planned(durability, client, warn=False)))


def worker_confirm(acked, durability: Durability, what: str, client: redis.Redis | None = None) -> bool:
    """A worker's write: log a miss (and pause waits for ``PAUSE_AFTER_MISS``); whether a replica confirmed it.
    A miss because the replica went away (``min_replicas`` 0, none in sync now) is logged as degradation."""
    if int(acked) >= durability.replicas:
        return True
    if _gone(durability, client, warn=False):
        return False
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
