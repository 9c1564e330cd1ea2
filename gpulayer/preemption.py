"""Preemption: which running gangs make room for a waiting one of higher priority. Pure, over a snapshot.

A waiting gang that does not fit may take the slots of running gangs of *lower* priority (higher
number wins, ``GangSpec.priority``). The victims are taken in this order, and never one that has
run less than ``min_runtime`` seconds:

1. lowest priority first;
2. then the one whose user is most over its share (``over_share``: a number the fair-share
   accounting computes, 0 for a user within its share);
3. then the one that has run the shortest time (the least work lost).

The set returned is the shortest prefix of that order after which the gang fits, with every victim
that is not needed dropped again (most protected first), so no victim can be spared. None: no set of
allowed victims makes room, and the gang just waits.

>>> victims = choose_victims(spec, workers, held, running, now=t, min_runtime=60.0)   # doctest: +SKIP
>>> victims.victims[0].id, victims.placement.workers                                   # doctest: +SKIP
('9f0c...', ('w-a', 'w-b'))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import JobRejected
from .models import GangPlacement, GangSpec, WorkerInfo
from .placement import GangWaiting, place_gang


@dataclass(frozen=True)
class Running:
    """One running gang, as preemption sees it."""

    id: str
    priority: int
    started: float  # when its attempt was placed (the snapshot's clock)
    holds: dict[str, int] = field(default_factory=dict)  # worker id -> slots it holds there
    over_share: float = 0.0  # how far its user is over its share (0: within it); from the fair-share accounting

    def runtime(self, now: float) -> float:
        return now - self.started


@dataclass(frozen=True)
class Preemption:
    """The victims to stop (in the order they were chosen) and where the waiting gang goes once they have."""

    victims: tuple[Running, ...]
    placement: GangPlacement


def order(running: Sequence[Running], now: float) -> list[Running]:
    """Victims in the order they are taken: lowest priority, most over its share, shortest running."""
    return sorted(running, key=lambda r: (r.priority, -r.over_share, r.runtime(now), r.id))


def allowed(priority: int, running: Sequence[Running], now: float, min_runtime: float) -> list[Running]:
    """The running gangs a request of ``priority`` may stop, in victim order."""
    return order([r for r in running if r.priority < priority and r.runtime(now) >= min_runtime], now)


def _freed(held: dict[str, int], victims: Sequence[Running]) -> dict[str, int]:
    out = dict(held)
    for v in victims:
        for worker, n in v.holds.items():
            out[worker] = max(0, out.get(worker, 0) - n)
    return {w: n for w, n in out.items() if n}


def _fits(spec: GangSpec, workers: Sequence[WorkerInfo], held: dict[str, int],
          victims: Sequence[Running]) -> GangPlacement | None:
    try:
        return place_gang(spec, workers, _freed(held, victims))
    except (GangWaiting, JobRejected):
        return None


def choose_victims(spec: GangSpec, workers: Sequence[WorkerInfo], held: dict[str, int], running: Sequence[Running],
                   *, now: float, min_runtime: float) -> Preemption | None:
    """The fewest running gangs whose slots make ``spec`` fit, or None (see the module docstring).

    ``workers``: the registry snapshot (``busy`` counts ordinary jobs, which are not preempted);
    ``held``: the slot ledger (slots gangs hold per worker), the victims' slots included;
    ``running``: the running gangs (those already being stopped belong in ``held`` as freed, not here).
    """
    candidates = allowed(spec.priority, running, now, min_runtime)
    chosen: list[Running] = []
    for victim in candidates:
        chosen.append(victim)
        if _fits(spec, workers, held, chosen) is not None:
            break
    else:
        return None
    # Spare every victim the others make enough room without, the most protected (last chosen) first.
    for victim in reversed(list(chosen)):
        rest = [v for v in chosen if v is not victim]
        if rest and _fits(spec, workers, held, rest) is not None:
            chosen = rest
    placement = _fits(spec, workers, held, chosen)
    assert placement is not None
    return Preemption(tuple(chosen), placement)
