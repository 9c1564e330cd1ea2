"""Fair share and quotas: pure functions over a snapshot of policies, usage and running work (no Redis).

The formulas are Slurm's (docs/FAIRSHARE.md writes them out):

- usage: slot-seconds (GPU-seconds for a job on GPUs), decayed with a half-life ``H``
  (``fair_share_half_life``, Slurm's PriorityDecayHalfLife): ``U(t) = U(t0) * 2^(-(t - t0)/H) + new``;
- normalised shares, down an account tree: ``S = (s / s_siblings) * S_parent`` (root: 1);
- normalised usage: ``U_A = u / u_root`` (an account's usage is the sum of its children's);
- effective usage ("Classic"): ``U_E = U_A`` under root, else ``U_E = U_A + (U_E,parent - U_A) * s / s_siblings``;
- fair-share factor: ``F = 2^(-U_E / S)`` (1 with no usage; 0 with no share);
- multifactor priority: ``w_fs * F + w_age * min(age / max_age, 1) + w_pri * priority / max_priority``.

A take orders users by :func:`rank` (highest priority first); a quota (:func:`over_quota`) holds a user's job back
with the reason, never refuses it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping

ROOT = "root"


@dataclass(frozen=True)
class Policy:
    """One user's policy (a value of ``keys.USERS``): share, quotas (None: unlimited), priority, account."""

    share: float = 1.0
    max_slots: int | None = None
    max_gpus: int | None = None
    max_gangs: int | None = None
    priority: int = 0
    account: str = ROOT  # the account the user charges (keys.ACCOUNTS names the tree above it)


@dataclass(frozen=True)
class Account:
    """An account of the tree (a value of ``keys.ACCOUNTS``): its share among its siblings and its parent."""

    share: float = 1.0
    parent: str = ROOT


@dataclass(frozen=True)
class Weights:
    """Slurm's PriorityWeightFairshare / PriorityWeightAge / PriorityWeightQOS-like job priority, PriorityMaxAge."""

    fair_share: float = 1000.0
    age: float = 0.0
    priority: float = 0.0
    max_age: float = 7 * 86400.0
    # A ranking charges each slot a user holds now for this many seconds more (not Slurm's): without it, every
    # freed slot goes to one user until its usage crosses the other's, and slots swing 8/0 - 0/8 around the share
    running_horizon: float = 60.0


@dataclass(frozen=True)
class Share:
    """What `gpulayer status` shows per user, as sshare names them."""

    norm_shares: float  # S
    norm_usage: float  # U_A
    effective_usage: float  # U_E
    factor: float  # F


@dataclass(frozen=True)
class Running:
    """What one user holds now: slots (a taken job holds 1, a gang its ranks), GPUs, gangs."""

    slots: int = 0
    gpus: int = 0
    gangs: int = 0


@dataclass(frozen=True)
class Snapshot:
    """Everything a ranking reads: policies, accounts, decayed usage (slot-seconds) and what each user runs."""

    policies: Mapping[str, Policy] = field(default_factory=dict)
    accounts: Mapping[str, Account] = field(default_factory=dict)
    usage: Mapping[str, float] = field(default_factory=dict)
    running: Mapping[str, Running] = field(default_factory=dict)


# -- parsing (the values users45's table and `gpulayer` write) --------------------------------------------------------
def _limit(value) -> int | None:
    return None if value is None else int(value)


def parse_policy(raw: str | bytes) -> Policy:
    """A ``keys.USERS`` value (JSON); fields other than these (signatures, tokens) are ignored."""
    d = json.loads(raw)
    return Policy(share=float(d.get("share", 1.0)), max_slots=_limit(d.get("max_slots")),
                  max_gpus=_limit(d.get("max_gpus")), max_gangs=_limit(d.get("max_gangs")),
                  priority=int(d.get("priority") or 0), account=str(d.get("account") or ROOT))


def parse_account(raw: str | bytes) -> Account:
    d = json.loads(raw)
    return Account(share=float(d.get("share", 1.0)), parent=str(d.get("parent") or ROOT))


# -- usage and its decay ----------------------------------------------------------------------------------------------
def decayed(value: float, since: float, now: float, half_life: float) -> float:
    """``value`` recorded at ``since``, as of ``now``: halved every ``half_life`` seconds."""
    if half_life <= 0 or now <= since:
        return value
    return value * 2.0 ** (-(now - since) / half_life)


def add_usage(value: float, since: float, now: float, amount: float, half_life: float) -> float:
    """The decayed usage after ``amount`` more slot-seconds at ``now``."""
    return decayed(value, since, now, half_life) + amount


def weight(gpus: int) -> int:
    """Slots a job charges per second it holds one: its GPUs on a GPU slot, else 1."""
    return gpus if gpus > 0 else 1


# -- the tree -------------------------------------------------------------------------------------------------------
def _parent_of(name: str, snap: Snapshot) -> str | None:
    if name == ROOT:
        return None
    if name in snap.policies:
        return snap.policies[name].account
    return snap.accounts[name].parent if name in snap.accounts else ROOT


def _raw_share(name: str, snap: Snapshot) -> float:
    if name in snap.policies:
        return max(0.0, snap.policies[name].share)
    return max(0.0, snap.accounts[name].share) if name in snap.accounts else 0.0


def _children(snap: Snapshot) -> dict[str, list[str]]:
    kids: dict[str, list[str]] = {}
    names = [*snap.accounts, *snap.policies]
    for name in names:
        parent = _parent_of(name, snap)
        if parent is not None and parent != name:
            kids.setdefault(parent, []).append(name)
    return kids


def shares(snap: Snapshot) -> dict[str, Share]:
    """Every user's (and account's) S, U_A, U_E and F, by Slurm's Classic formulas."""
    kids = _children(snap)
    usage: dict[str, float] = {}

    def total(name: str, seen: frozenset = frozenset()) -> float:  # an account's usage: its children's sum
        if name in usage:
            return usage[name]
        if name in seen:  # (an account that is its own ancestor: a cycle counts nothing)
            return 0.0
        own = max(0.0, snap.usage.get(name, 0.0)) if name in snap.policies else 0.0
        usage[name] = own + sum(total(k, seen | {name}) for k in kids.get(name, ()))
        return usage[name]

    root_usage = total(ROOT)
    out: dict[str, Share] = {}

    def walk(name: str, norm_shares: float, ue_parent: float | None, depth: int) -> None:
        siblings = kids.get(name, ())
        level = sum(_raw_share(k, snap) for k in siblings)
        for k in siblings:
            s = _raw_share(k, snap)
            norm = norm_shares * (s / level) if level > 0 else 0.0
            ua = usage.get(k, 0.0) / root_usage if root_usage > 0 else 0.0
            if ue_parent is None:  # under root: U_E = U_A
                ue = ua
            else:
                ue = ua + (ue_parent - ua) * (s / level if level > 0 else 0.0)
            out[k] = Share(norm, ua, ue, factor(ue, norm))
            if k in kids and depth < 64:
                walk(k, norm, ue, depth + 1)

    walk(ROOT, 1.0, None, 0)
    return out


def factor(effective_usage: float, norm_shares: float) -> float:
    """Slurm's fair-share factor ``F = 2^(-U_E/S)``: 1 for no usage, 0.5 at exactly its share, 0 with no share."""
    if norm_shares <= 0:
        return 0.0
    return 2.0 ** (-effective_usage / norm_shares)


def multifactor(fair_share: float, age: float, job_priority: int, max_priority: int, weights: Weights) -> float:
    """Slurm's multifactor priority: each factor in [0, 1], times its weight, summed."""
    age_factor = min(max(age, 0.0) / weights.max_age, 1.0) if weights.max_age > 0 else 0.0
    pri_factor = job_priority / max_priority if max_priority > 0 else 0.0
    return weights.fair_share * fair_share + weights.age * age_factor + weights.priority * pri_factor


def rank(snap: Snapshot, weights: Weights = Weights()) -> list[str]:
    """The users with a policy, the one whose jobs should take the next contended slot first.

    Each user's priority is :func:`multifactor` of its F and its policy's priority (a take sees users, not jobs:
    no age), F from its usage plus ``running_horizon`` seconds of the slots it holds now (so the slots settle at
    the shares instead of swinging). Ties (no usage yet, the same F) go to the user holding fewest slots per
    share, then by name."""
    if weights.running_horizon > 0:
        ahead = {u: snap.usage.get(u, 0.0) + weights.running_horizon * snap.running.get(u, Running()).slots
                 for u in snap.policies}
        snap = Snapshot(policies=snap.policies, accounts=snap.accounts, usage=ahead, running=snap.running)
    computed = shares(snap)
    max_priority = max((p.priority for p in snap.policies.values()), default=0)

    def key(user: str):
        share = computed.get(user)
        f = share.factor if share else 0.0
        norm = share.norm_shares if share else 0.0
        held = snap.running.get(user, Running()).slots
        per_share = held / norm if norm > 0 else math.inf
        return (-multifactor(f, 0.0, snap.policies[user].priority, max_priority, weights), per_share, user)

    return sorted(snap.policies, key=key)


# -- quotas ---------------------------------------------------------------------------------------------------------
def over_quota(user: str, policy: Policy | None, running: Running, slots: int = 1, gpus: int = 0,
               gangs: int = 0) -> str | None:
    """Why ``user`` may not start ``slots`` slots / ``gpus`` GPUs / ``gangs`` gangs more now, or None.

    >>> over_quota("alice", Policy(max_slots=4), Running(slots=4))
    'alice: 4 of 4 slots in use (quota)'
    """
    if policy is None:
        return None
    checks = ((policy.max_slots, running.slots, slots, "slots"), (policy.max_gpus, running.gpus, gpus, "GPUs"),
              (policy.max_gangs, running.gangs, gangs, "distributed jobs"))
    for limit, used, asked, what in checks:
        if limit is not None and asked > 0 and used + asked > limit:
            return f"{user}: {used} of {limit} {what} in use (quota)"
    return None

