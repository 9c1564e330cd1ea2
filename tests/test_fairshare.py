"""The pure fair-share core (gpulayer/fairshare.py) against factors computed by hand from docs/FAIRSHARE.md."""

import math

import pytest

from gpulayer import fairshare as fs
from gpulayer.fairshare import Account, Policy, Running, Snapshot, Weights


def tree() -> Snapshot:
    # root -> A (40), B (60); A -> users a1 (1), a2 (3); B -> user b1 (1). Usage 30 + 10 + 60 = 100.
    return Snapshot(policies={"a1": Policy(share=1, account="A"), "a2": Policy(share=3, account="A"),
                              "b1": Policy(share=1, account="B")},
                    accounts={"A": Account(share=40), "B": Account(share=60)},
                    usage={"a1": 30.0, "a2": 10.0, "b1": 60.0})


def test_classic_factors_of_a_small_account_tree():
    """S = (s/s_siblings) * S_parent; U_A = u/u_root; U_E = U_A under root, else U_A + (U_E,parent - U_A) * s/s_sib;
    F = 2^(-U_E/S). By hand: A: S .4, U_A .4, U_E .4, F .5; B: .6 .6 .6 .5;
    a1: S .4*1/4 = .1, U_A .3, U_E .3 + (.4 - .3)/4 = .325, F = 2^-3.25;
    a2: S .4*3/4 = .3, U_A .1, U_E .1 + (.4 - .1)*3/4 = .325, F = 2^(-.325/.3);
    b1: S .6, U_A .6, U_E .6 + 0 = .6, F .5."""
    got = fs.shares(tree())
    expect = {"A": (0.4, 0.4, 0.4, 0.5), "B": (0.6, 0.6, 0.6, 0.5),
              "a1": (0.1, 0.3, 0.325, 2 ** -3.25), "a2": (0.3, 0.1, 0.325, 2 ** (-0.325 / 0.3)),
              "b1": (0.6, 0.6, 0.6, 0.5)}
    for name, (s, ua, ue, f) in expect.items():
        share = got[name]
        assert share.norm_shares == pytest.approx(s)
        assert share.norm_usage == pytest.approx(ua)
        assert share.effective_usage == pytest.approx(ue)
        assert share.factor == pytest.approx(f)
    assert got["a1"].factor == pytest.approx(0.10511, abs=1e-5)
    assert got["a2"].factor == pytest.approx(0.47193, abs=1e-5)


def test_rank_puts_the_user_furthest_below_its_share_first():
    assert fs.rank(tree()) == ["b1", "a2", "a1"]
    flat = Snapshot(policies={"alice": Policy(share=3), "bob": Policy(share=1)}, usage={"alice": 70, "bob": 30})
    # alice: S .75, U .7 -> F 2^(-.933) .52; bob: S .25, U .3 -> F 2^(-1.2) .44
    assert fs.rank(flat) == ["alice", "bob"]
    flat = Snapshot(policies=flat.policies, usage={"alice": 80, "bob": 20})
    assert fs.rank(flat) == ["bob", "alice"]


def test_no_usage_ties_go_to_the_user_with_fewest_slots_per_share():
    snap = Snapshot(policies={"alice": Policy(share=3), "bob": Policy(share=1)},
                    running={"alice": Running(slots=2), "bob": Running(slots=1)})
    assert fs.rank(snap) == ["alice", "bob"]  # 2/.75 < 1/.25
    snap = Snapshot(policies=snap.policies, running={"alice": Running(slots=4), "bob": Running(slots=1)})
    assert fs.rank(snap) == ["bob", "alice"]


def test_no_usage_and_no_share():
    snap = Snapshot(policies={"a": Policy(share=1), "z": Policy(share=0)})
    got = fs.shares(snap)
    assert got["a"].factor == 1.0 and got["z"].factor == 0.0
    assert fs.rank(snap) == ["a", "z"]


def test_half_life_decay():
    assert fs.decayed(100.0, 0.0, 86400.0, 86400.0) == pytest.approx(50.0)
    assert fs.decayed(100.0, 0.0, 2 * 86400.0, 86400.0) == pytest.approx(25.0)
    assert fs.add_usage(100.0, 0.0, 3600.0, 10.0, 3600.0) == pytest.approx(60.0)
    assert fs.decayed(100.0, 10.0, 5.0, 3600.0) == 100.0  # (a clock behind: no growth)
    assert fs.weight(0) == 1 and fs.weight(4) == 4


def test_multifactor_priority_is_the_weighted_sum():
    w = Weights(fair_share=1000, age=100, priority=10, max_age=1000)
    assert fs.multifactor(0.5, 500, 2, 4, w) == pytest.approx(500 + 50 + 5)
    assert fs.multifactor(0.5, 5000, 2, 4, w) == pytest.approx(500 + 100 + 5)  # age caps at max_age
    assert fs.multifactor(1.0, 0, 0, 0, w) == pytest.approx(1000)
    # a user's priority outweighs F when its weight does
    snap = Snapshot(policies={"a": Policy(priority=0), "b": Policy(priority=5)}, usage={"b": 10})
    assert fs.rank(snap) == ["a", "b"]
    assert fs.rank(snap, Weights(fair_share=1, priority=1000)) == ["b", "a"]


def test_quota_reasons():
    p = Policy(max_slots=4, max_gpus=2, max_gangs=1)
    assert fs.over_quota("alice", p, Running(slots=3)) is None
    assert fs.over_quota("alice", p, Running(slots=4)) == "alice: 4 of 4 slots in use (quota)"
    assert fs.over_quota("alice", p, Running(slots=1, gpus=2), gpus=1) == "alice: 2 of 2 GPUs in use (quota)"
    assert fs.over_quota("alice", p, Running(gangs=1), slots=2, gangs=1) == \
        "alice: 1 of 1 distributed jobs in use (quota)"
    assert fs.over_quota("alice", None, Running(slots=100)) is None


def test_parse_ignores_other_fields():
    p = fs.parse_policy('{"share": 2.5, "max_slots": 4, "max_gpus": null, "priority": 3, "sig": "x", "token": "y"}')
    assert p == Policy(share=2.5, max_slots=4, max_gpus=None, max_gangs=None, priority=3)
    assert fs.parse_account('{"share": 40}') == Account(share=40)
    assert math.isclose(fs.factor(0.25, 0.25), 0.5)
