"""Victim choice (``gpulayer/preemption.py``): pure, over a snapshot. The real thing is ``test_preemption.py``."""

from __future__ import annotations

from gpulayer.models import GangSpec, WorkerInfo
from gpulayer.preemption import Running, choose_victims, order
from gpulayer.store.gangs import line_score

NOW = 1000.0


def w(id, slots=2, busy=0, host=None):
    return WorkerInfo(id=id, hostname=host or id, address="127.0.0.1", slots=slots, busy=busy)


def gang(nodes=2, procs=2, priority=5):
    return GangSpec(gang_id="waiting", nodes=nodes, procs_per_node=procs, priority=priority)


def run(id, priority=0, ran=100.0, holds=None, over_share=0.0):
    return Running(id=id, priority=priority, started=NOW - ran, holds=holds or {}, over_share=over_share)


def held_by(*running):
    out = {}
    for r in running:
        for k, n in r.holds.items():
            out[k] = out.get(k, 0) + n
    return out


FULL = (w("a"), w("b"))


def test_a_gang_that_holds_the_whole_fleet_is_the_one_victim():
    low = run("low", holds={"a": 2, "b": 2})
    choice = choose_victims(gang(), FULL, held_by(low), [low], now=NOW, min_runtime=60)
    assert [v.id for v in choice.victims] == ["low"] and set(choice.placement.workers) == {"a", "b"}


def test_only_lower_priority_and_old_enough_gangs_are_victims():
    same = run("same", priority=5, holds={"a": 2, "b": 2})
    assert choose_victims(gang(), FULL, held_by(same), [same], now=NOW, min_runtime=60) is None
    young = run("young", ran=10.0, holds={"a": 2, "b": 2})
    assert choose_victims(gang(), FULL, held_by(young), [young], now=NOW, min_runtime=60) is None
    assert choose_victims(gang(), FULL, held_by(young), [young], now=NOW, min_runtime=5) is not None
    # Priority 0 (the default) preempts nobody: nothing is below it.
    low = run("low", holds={"a": 2, "b": 2})
    assert choose_victims(gang(priority=0), FULL, held_by(low), [low], now=NOW, min_runtime=0) is None


def test_victims_are_taken_lowest_priority_then_most_over_share_then_shortest_running():
    rs = [run("p1-old", priority=1, ran=500), run("p0-fair", priority=0, ran=100),
          run("p0-over", priority=0, ran=900, over_share=2.0), run("p1-young", priority=1, ran=70)]
    assert [r.id for r in order(rs, NOW)] == ["p0-over", "p0-fair", "p1-young", "p1-old"]


def test_the_set_is_minimal_one_victim_that_frees_enough_spares_the_rest():
    # A 1 x 2 request needs one whole worker; a is freed by its two holders, b's third holder is spared.
    fleet = (w("a"), w("b"))
    first = run("first", priority=0, ran=100, holds={"a": 1, "b": 1})  # taken first, frees one slot per worker
    second = run("second", priority=1, ran=100, holds={"a": 1})
    third = run("third", priority=2, ran=100, holds={"b": 1})
    held = held_by(first, second, third)
    choice = choose_victims(gang(nodes=1, procs=2), fleet, held, [first, second, third], now=NOW, min_runtime=0)
    assert sorted(v.id for v in choice.victims) == ["first", "second"]
    assert choice.placement.workers == ("a",)


def test_a_victim_not_needed_after_a_later_one_is_spared():
    fleet = (w("a"), w("b"))
    small = run("small", priority=0, ran=100, holds={"b": 1})  # taken first, but b still has the other's slot
    big = run("big", priority=1, ran=100, holds={"a": 2})       # freeing a alone is enough
    other = run("other", priority=3, ran=100, holds={"b": 1})
    held = held_by(small, big, other)
    choice = choose_victims(gang(nodes=1, procs=2), fleet, held, [small, big, other], now=NOW, min_runtime=0)
    assert [v.id for v in choice.victims] == ["big"]


def test_ordinary_jobs_are_not_preempted_so_a_busy_worker_may_leave_no_room():
    busy = (w("a", busy=1), w("b", busy=1))
    low = run("low", holds={"a": 1, "b": 1})
    assert choose_victims(gang(), busy, held_by(low), [low], now=NOW, min_runtime=0) is None
    assert choose_victims(gang(procs=1), busy, held_by(low), [low], now=NOW, min_runtime=0).victims[0].id == "low"


def test_the_waiting_line_puts_higher_priority_first_then_arrival():
    assert line_score(9, 10**9) < line_score(1, 1) < line_score(0, 0) < line_score(0, 1)
