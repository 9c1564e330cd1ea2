"""Fair share and quotas in Redis: the policies a process reads, the order a worker takes users' lists in, and
the holds that end without a take's ack.

The decisions are gpulayer/fairshare.py's (pure, over a :class:`~gpulayer.fairshare.Snapshot`); this module reads
the snapshot (keys in store/keys.py, "Fair share") and hands the results to the transport (engine/transport.py):

- a sender pushes a job of a user with a policy onto that user's list of the queue (:func:`queue_key`);
- a worker takes its queues' users' lists in :func:`~gpulayer.fairshare.rank` order, each queue's own list
  last (:class:`Order`), and take.lua holds a job back while its user is at a quota;
- the slots a job holds for its user are given back at its ack (take.lua), and here when a worker gives an
  unstarted message back or a dead worker's message is requeued or dropped (:func:`release`).

With no policy (``keys.USERS`` empty), :func:`queue_key` and :class:`Order` change nothing.
"""

from __future__ import annotations

import os
from importlib import resources
from time import monotonic, time

from .. import fairshare
from ..fairshare import Policy, Running, Snapshot, Weights
from . import keys

POLICIES_EVERY = 1.0  # seconds a process reuses the policies it read (a new policy applies within this)
ORDER_EVERY = 0.25  # seconds a worker reuses its users' order while fair share is on
RELEASE = resources.files("gpulayer.store").joinpath("lua", "fair_release.lua").read_text()

half_life = 86400.0  # fair_share_half_life, set by gpulayer.app.configure
weights = Weights()

_policies: dict[tuple[int, int], tuple[float, dict[str, Policy]]] = {}  # (pid, pool) -> (read at, policies)


def configure(half_life_seconds: float, priority_weights: Weights) -> None:
    """This process's half-life and priority weights (the ``fair_share_*`` settings)."""
    global half_life, weights
    half_life, weights = float(half_life_seconds), priority_weights


def _parse_all(raw: dict) -> dict[str, Policy]:
    out = {}
    for user, value in raw.items():
        try:
            out[user.decode() if isinstance(user, bytes) else user] = fairshare.parse_policy(value)
        except (ValueError, TypeError, AttributeError):
            continue  # (a value that is not a policy: that user is served as one without)
    return out


def policies(client) -> dict[str, Policy]:
    """Every user's policy, read at most once per ``POLICIES_EVERY`` per process and server."""
    slot = (os.getpid(), id(client.connection_pool))
    read_at, known = _policies.get(slot, (-POLICIES_EVERY, {}))
    if monotonic() - read_at >= POLICIES_EVERY:
        known = _parse_all(client.hgetall(keys.USERS))
        _policies[slot] = (monotonic(), known)
    return known


def forget() -> None:
    """Read the policies again at the next use (tests, and `gpulayer` commands that just wrote them)."""
    _policies.clear()


def queue_key(client, key: str, user: str | None) -> str:
    """The list a job of ``user`` for the queue kept at ``key`` goes to: the user's while it has a policy."""
    if user and user in policies(client):
        return keys.user_queue(key, user)
    return key


def running_of(raw: dict, user: str) -> Running:
    def num(field: str) -> float:
        value = raw.get(f"{field}:{user}") or raw.get(f"{field}:{user}".encode())
        return float(value) if value is not None else 0.0
    return Running(slots=max(0, int(num("slots"))), gpus=max(0, int(num("gpus"))), gangs=max(0, int(num("gangs"))))


def _text(raw: dict) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()}


def snapshot(client, now: float | None = None) -> Snapshot:
    """Policies, accounts, usage (decayed to ``now``, plus what running jobs accrued) and holds: one round trip."""
    now = time() if now is None else now
    pipe = client.pipeline(transaction=False)
    for key in (keys.USERS, keys.ACCOUNTS, keys.FAIR_RUNNING, keys.FAIR_USAGE):
        pipe.hgetall(key)
    users_raw, accounts_raw, running_raw, usage_raw = pipe.execute()
    return snapshot_of(users_raw, accounts_raw, running_raw, usage_raw, now)


def snapshot_of(users_raw: dict, accounts_raw: dict, running_raw: dict, usage_raw: dict, now: float) -> Snapshot:
    users = _parse_all(users_raw)
    accounts = {}
    for name, value in _text(accounts_raw).items():
        try:
            accounts[name] = fairshare.parse_account(value)
        except (ValueError, TypeError, AttributeError):
            continue
    running, usage = _text(running_raw), _text(usage_raw)
    used, held = {}, {}
    for user in users:
        value = float(usage.get(f"u:{user}", 0.0))
        at = float(usage.get(f"at:{user}", now))
        charging = float(running.get(f"weight:{user}", 0.0))
        since = float(running.get(f"since:{user}", 0.0))
        used[user] = fairshare.decayed(value, at, now, half_life) + max(0.0, charging * now - since)
        held[user] = running_of(running, user)
    return Snapshot(policies=users, accounts=accounts, usage=used, running=held)


class Order:
    """A worker's order of the lists it takes from: per queue key, its users' lists by rank, then its own."""

    def __init__(self):
        self._read_at = -1.0
        self._ranked: list[str] = []

    @property
    def on(self) -> bool:
        """Was fair share on (a policy in Redis) at the last read?"""
        return bool(self._ranked)

    def keys(self, client, poll_keys: list[str]) -> list[str]:
        """``poll_keys`` with each one's users' lists before it, best-ranked first (unchanged with no policy)."""
        if monotonic() - self._read_at >= (ORDER_EVERY if self._ranked else POLICIES_EVERY):
            self._read_at = monotonic()
            snap = snapshot(client)
            self._ranked = fairshare.rank(snap, weights) if snap.policies else []
        if not self._ranked:
            return poll_keys
        return [k for key in poll_keys for k in (*(keys.user_queue(key, u) for u in self._ranked), key)]


def release(pipe, tags: list[str], charge: bool, now: float | None = None) -> None:
    """Add to ``pipe`` the end of the fair-share holds of ``tags`` (none held: nothing happens)."""
    if tags:
        pipe.eval(RELEASE, len(keys.FAIR_KEYS), *keys.FAIR_KEYS, time() if now is None else now, half_life,
                  1 if charge else 0, *tags)


def gang_hold(gang_id: str, attempt: int, worker_id: str) -> str:
    """The ``keys.FAIR_TAKEN`` field of one gang node's hold (reserve.lua writes it)."""
    return f"gang:{gang_id}:{attempt}:{worker_id}"


def gang_holds_of(client, worker_id: str) -> list[str]:
    """Every gang node's hold on ``worker_id`` (a worker that restarts holds none any more)."""
    return [raw.decode() if isinstance(raw, bytes) else raw for raw, _ in
            client.hscan_iter(keys.FAIR_TAKEN, match=f"gang:*:{keys.glob_escape(worker_id)}", count=1000)]
