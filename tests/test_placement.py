"""Routing is pure: a snapshot in, a queue or a reason out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer import queues
from gpulayer.errors import JobRejected
from gpulayer.models import Resources, WorkerInfo
from gpulayer.placement import eligible_workers, route


def w(id, gpus=0, zone=None, region=None, slots=2, busy=0):
    return WorkerInfo(id=id, hostname="h", address="127.0.0.1", zone=zone, region=region, gpus=gpus,
                      slots=slots, busy=busy)


FLEET = (
    w("cpu-a", zone="europe-west1-b", region="europe-west1"),
    w("cpu-b", zone="europe-west1-c", region="europe-west1"),
    w("gpu-1", gpus=1, zone="europe-west4-a", region="europe-west4"),
    w("gpu-4", gpus=4, zone="us-central1-a", region="us-central1"),
)


def test_cpu_job_goes_to_the_shared_cpu_queue():
    r = route(Resources(), FLEET)
    assert r.queue == queues.capability(0)
    assert set(r.eligible) == {w.id for w in FLEET}  # GPU machines serve CPU jobs too


def test_cuda_job_only_reaches_gpu_workers():
    r = route(Resources(cuda=True), FLEET)
    assert r.queue == queues.capability(1)
    assert set(r.eligible) == {"gpu-1", "gpu-4"}


def test_multi_gpu_job_needs_enough_gpus_per_worker():
    r = route(Resources(gpus=2), FLEET)
    assert r.queue == queues.capability(2)
    assert r.eligible == ("gpu-4",)
    with pytest.raises(JobRejected, match="CUDA with 8 GPUs"):
        route(Resources(gpus=8), FLEET)


def test_cuda_on_cpu_fleet_is_refused_naming_cuda_and_what_is_live():
    with pytest.raises(JobRejected) as e:
        route(Resources(cuda=True), FLEET[:2])
    msg = str(e.value)
    assert "CUDA" in msg and "cpu-a cpu europe-west1-b" in msg and "drop cuda=True" in msg


def test_zone_and_region_routing():
    assert route(Resources(zone="europe-west1-c"), FLEET).queue == queues.capability(0, zone="europe-west1-c")
    assert route(Resources(region="europe-west1"), FLEET).eligible == ("cpu-a", "cpu-b")
    assert route(Resources(cuda=True, region="us-central1"), FLEET).queue == queues.capability(1, region="us-central1")


def test_unknown_zone_suggests_the_nearest_names():
    with pytest.raises(JobRejected, match=r"did you mean .*'europe-west1-b'"):
        route(Resources(zone="europe-west1-x"), FLEET)


def test_zone_that_exists_but_lacks_cuda():
    with pytest.raises(JobRejected, match="zone 'europe-west1-b'"):
        route(Resources(cuda=True, zone="europe-west1-b"), FLEET)


def test_pinned_job_goes_to_the_least_busy_named_worker():
    fleet = (w("a", busy=2, slots=2), w("b", busy=0, slots=2), w("c"))
    assert route(Resources(worker_ids=["a", "b"]), fleet).queue == queues.private("b")
    assert route(Resources(worker_ids="c"), fleet).queue == queues.private("c")


def test_pinned_to_unknown_worker_is_refused_with_a_suggestion():
    with pytest.raises(JobRejected, match=r"no live worker named 'cpu-x' \(did you mean .*'cpu-a'"):
        route(Resources(worker_ids=["cpu-x"]), FLEET)


def test_empty_fleet_says_how_to_start_a_worker():
    with pytest.raises(JobRejected, match="gpulayer worker"):
        route(Resources(), ())


def test_resources_validation():
    assert Resources(gpus=2).cuda is True
    assert Resources(cuda=True).gpus == 1
    with pytest.raises(ValueError, match="no field 'gpu'; did you mean gpus"):
        Resources(gpu=1)
    with pytest.raises(ValueError, match=r"Resources\(gpus=-1\): gpus must be at least 0"):
        Resources(gpus=-1)
    with pytest.raises(ValueError, match="at least one worker"):
        Resources(worker_ids=[])


def test_worker_consumes_exactly_the_queues_routing_can_name():
    names = set(queues.for_worker("gpu-4", 4, "us-central1-a", "us-central1"))
    assert queues.capability(4, zone="us-central1-a") in names
    assert queues.capability(5) not in names
    assert queues.private("gpu-4") in names
    assert queues.capability(0) in names


# --- properties -------------------------------------------------------------------------------

ZONES = ["za", "zb", "zc"]
REGIONS = {"za": "r1", "zb": "r1", "zc": "r2"}


@st.composite
def fleets(draw):
    n = draw(st.integers(min_value=0, max_value=12))
    out = []
    for i in range(n):
        zone = draw(st.sampled_from(ZONES + [None]))
        out.append(w(f"w{i}", gpus=draw(st.integers(0, 4)), zone=zone, region=REGIONS.get(zone),
                     slots=draw(st.integers(1, 8)), busy=draw(st.integers(0, 8))))
    return tuple(out)


@st.composite
def requests(draw):
    return Resources(cuda=draw(st.booleans()), gpus=draw(st.integers(0, 5)),
                     zone=draw(st.sampled_from(ZONES + [None, "nowhere"])),
                     region=draw(st.sampled_from(["r1", "r2", None])),
                     worker_ids=draw(st.one_of(st.none(), st.lists(st.sampled_from([f"w{i}" for i in range(14)]),
                                                                    min_size=1, max_size=3))))


def _satisfies(worker: WorkerInfo, res: Resources) -> bool:
    return ((not res.cuda or worker.gpus >= res.gpus) and (res.zone is None or worker.zone == res.zone)
            and (res.region is None or worker.region == res.region)
            and (res.worker_ids is None or worker.id in res.worker_ids))


def _names_unknown(fleet, res) -> bool:
    """A pin naming a worker that is not live is refused outright (most likely a typo)."""
    return bool(res.worker_ids) and not set(res.worker_ids) <= {x.id for x in fleet}


@settings(max_examples=400, deadline=None)
@given(fleets(), requests())
def test_routing_never_picks_a_worker_lacking_a_requirement(fleet, res):
    if _names_unknown(fleet, res):
        with pytest.raises(JobRejected, match="no live worker"):
            route(res, fleet)
        return
    try:
        r = route(res, fleet)
    except JobRejected:
        # Refused only when truly no live worker satisfies the request.
        assert not any(_satisfies(x, res) for x in fleet)
        return
    by_id = {x.id: x for x in fleet}
    assert r.eligible, "a route always names who can take it"
    for wid in r.eligible:
        assert _satisfies(by_id[wid], res)
    # Every worker that reads the chosen queue satisfies the request.
    readers = [x for x in fleet if r.queue in queues.for_worker(x.id, x.gpus, x.zone, x.region)]
    assert readers and all(_satisfies(x, res) for x in readers)


@settings(max_examples=200, deadline=None)
@given(fleets(), requests())
def test_eligible_is_exactly_the_satisfying_workers(fleet, res):
    want = [] if _names_unknown(fleet, res) else [x.id for x in fleet if _satisfies(x, res)]
    try:
        got = [x.id for x in eligible_workers(res, fleet)]
    except JobRejected:
        got = []
    assert sorted(got) == sorted(set(want))


# --- gangs ------------------------------------------------------------------------------------

from gpulayer.models import GangSpec  # noqa: E402
from gpulayer.placement import GangWaiting, check_gang_fits_fleet, place_gang  # noqa: E402


def gang(nodes, procs, **res):
    return GangSpec(gang_id="g", nodes=nodes, procs_per_node=procs, resources=Resources(**res))


def wh(id, zone, region, slots=2, busy=0, host=None, gpus=0):
    return WorkerInfo(id=id, hostname=host or id, address=f"10.0.0.{id[-1]}", zone=zone, region=region,
                      slots=slots, busy=busy, gpus=gpus)


TWO_REGIONS = (
    wh("w1", "eu-1a", "eu"), wh("w2", "eu-1a", "eu"), wh("w3", "eu-1b", "eu"),
    wh("w4", "us-1a", "us"), wh("w5", "us-1b", "us"),
)


def test_gang_prefers_one_zone():
    p = place_gang(gang(2, 2), TWO_REGIONS, {})
    assert p.workers == ("w1", "w2") and p.reason == "placed on 2 workers in zone eu-1a"
    assert p.addresses == ("10.0.0.1", "10.0.0.2")


def test_gang_falls_back_to_one_region_then_across_regions():
    p = place_gang(gang(3, 2), TWO_REGIONS, {})
    assert set(p.workers) == {"w1", "w2", "w3"} and p.reason == "placed on 3 workers in region eu"
    p = place_gang(gang(4, 2), TWO_REGIONS, {})
    assert p.reason.startswith("placed across regions eu, us")


def test_gang_avoids_held_and_busy_slots():
    p = place_gang(gang(2, 2), TWO_REGIONS, {"w1": 1})
    assert "w1" not in p.workers and p.reason == "placed on 2 workers in region eu"
    busy = tuple(w.model_copy(update={"busy": 2}) if w.id == "w2" else w for w in TWO_REGIONS)
    assert "w2" not in place_gang(gang(2, 2), busy, {}).workers


def test_gang_that_fits_later_waits_with_the_free_slots_named():
    with pytest.raises(GangWaiting, match=r"waiting for 5 workers with 2 free slots each; free now: w1 0/2"):
        place_gang(gang(5, 2), TWO_REGIONS, {"w1": 2})


def test_gang_that_can_never_fit_is_rejected():
    with pytest.raises(JobRejected, match="needs 6 workers with 2 slots"):
        check_gang_fits_fleet(gang(6, 2), TWO_REGIONS)
    with pytest.raises(JobRejected, match="needs 1 workers with 3 slots"):
        place_gang(gang(1, 3), TWO_REGIONS, {})
    with pytest.raises(JobRejected, match="CUDA"):
        check_gang_fits_fleet(gang(1, 1, cuda=True), TWO_REGIONS)
    with pytest.raises(JobRejected, match="pinned to only 1 workers"):
        check_gang_fits_fleet(gang(2, 1, worker_ids=["w1"]), TWO_REGIONS)


def test_cuda_gang_needs_gpus_for_every_process():
    fleet = (wh("g1", "z", "r", slots=8, gpus=4), wh("g2", "z", "r", slots=8, gpus=8))
    assert place_gang(gang(1, 8, cuda=True), fleet, {}).workers == ("g2",)
    with pytest.raises(JobRejected, match="8 slots and 16 GPUs"):
        check_gang_fits_fleet(gang(1, 8, gpus=2), fleet)


def test_gang_packs_onto_fewer_hosts_among_equals():
    fleet = (wh("a1", "z", "r", host="h1"), wh("b1", "z", "r", host="h2"), wh("b2", "z", "r", host="h2"))
    assert place_gang(gang(2, 1), fleet, {}).workers == ("b1", "b2")


def test_pinned_gang_uses_exactly_the_named_workers():
    p = place_gang(gang(2, 1, worker_ids=["w5", "w3"]), TWO_REGIONS, {})
    assert set(p.workers) == {"w3", "w5"} and p.reason.startswith("pinned to")


@settings(max_examples=300, deadline=None)
@given(fleets(), st.integers(1, 4), st.integers(1, 4), st.dictionaries(st.sampled_from([f"w{i}" for i in range(12)]),
                                                                       st.integers(0, 4)))
def test_gang_placement_is_all_or_nothing_and_never_oversubscribes(fleet, nodes, procs, held):
    spec = GangSpec(gang_id="g", nodes=nodes, procs_per_node=procs)
    try:
        p = place_gang(spec, fleet, held)
    except (GangWaiting, JobRejected):
        return
    assert len(p.workers) == nodes == len(set(p.workers))
    by_id = {w.id: w for w in fleet}
    for wid in p.workers:
        w = by_id[wid]
        assert w.slots - w.busy - held.get(wid, 0) >= procs


# --- the snapshot index agrees with the reference implementation on every input ----------------

from gpulayer import placement  # noqa: E402
from gpulayer.placement_index import clear_cache, index_for  # noqa: E402

from . import placement_reference as reference  # noqa: E402

HOSTS = ["h1", "h2", "h3"]


@st.composite
def rich_fleets(draw):
    """Fleets with shared hosts, workers without zones, gang holds in the heartbeat, and busy slots."""
    n = draw(st.integers(min_value=0, max_value=14))
    out = []
    for i in range(n):
        zone = draw(st.sampled_from(ZONES + [None]))
        region = draw(st.sampled_from([REGIONS.get(zone), REGIONS.get(zone), None, "r3"]))
        slots = draw(st.integers(1, 8))
        out.append(WorkerInfo(id=f"w{i}", hostname=draw(st.sampled_from(HOSTS + [f"w{i}"])), address=f"10.0.0.{i}",
                              zone=zone, region=region, gpus=draw(st.sampled_from([0, 0, 1, 2, 4, 8])), slots=slots,
                              busy=draw(st.integers(0, slots)), held=draw(st.integers(0, 2))))
    return tuple(out)


def _outcome(fn, *args):
    """What a call returns, or the type and message of what it raises."""
    try:
        return "ok", fn(*args)
    except (JobRejected, GangWaiting, reference.GangWaiting) as err:
        kind = "waiting" if isinstance(err, (GangWaiting, reference.GangWaiting)) else "rejected"
        return kind, str(err)


def _same_route(a, b) -> bool:
    return a[0] == b[0] and (a[1] == b[1] if a[0] != "ok" else (a[1].queue, a[1].eligible) == (b[1].queue, b[1].eligible))


@settings(max_examples=500, deadline=None)
@given(rich_fleets(), st.lists(requests(), min_size=1, max_size=4), st.booleans())
def test_indexed_routing_matches_the_reference(fleet, reqs, as_list):
    snapshot = list(fleet) if as_list else fleet
    for res in reqs + reqs:  # the second pass answers from the index's memo
        assert _same_route(_outcome(placement.route, res, snapshot), _outcome(reference.route, res, snapshot))
        got, want = _outcome(placement.eligible_workers, res, snapshot), _outcome(reference.eligible_workers, res, snapshot)
        assert got == want


helds = st.dictionaries(st.sampled_from([f"w{i}" for i in range(16)]), st.integers(-1, 6), max_size=5)


@st.composite
def gang_specs(draw):
    res = draw(st.one_of(st.just(Resources()), requests()))
    return GangSpec(gang_id="g", nodes=draw(st.integers(1, 5)), procs_per_node=draw(st.integers(1, 6)), resources=res)


@settings(max_examples=800, deadline=None)
@given(rich_fleets(), st.lists(st.tuples(gang_specs(), helds), min_size=1, max_size=4))
def test_indexed_gang_placement_matches_the_reference(fleet, calls):
    # Several placements on one snapshot object, with different ledgers, exercise the remembered picks.
    for spec, held in calls + calls[::-1]:
        assert _outcome(placement.place_gang, spec, fleet, held) == _outcome(reference.place_gang, spec, fleet, held)
        assert (_outcome(placement.check_gang_fits_fleet, spec, fleet)
                == _outcome(reference.check_gang_fits_fleet, spec, fleet))


def _synthetic(n: int) -> tuple[WorkerInfo, ...]:
    out = []
    for i in range(n):
        z = i % 30
        out.append(WorkerInfo(id=f"w{i:05d}", hostname=f"h{i // 2:05d}", address="10.0.0.1", zone=f"z{z:02d}",
                              region=f"r{z // 3}", gpus=8 if i % 5 == 0 else 0, slots=8, busy=(i * 7) % 9 % 8))
    return tuple(out)


def test_indexed_placement_matches_the_reference_on_a_large_fleet():
    fleet = _synthetic(3000)
    held = {f"w{i:05d}": 4 for i in range(0, 3000, 37)}
    for spec in (gang(2, 2), gang(16, 4), gang(64, 8), gang(16, 4, cuda=True), gang(8, 8, zone="z03"),
                 gang(300, 8), gang(2, 2, region="r1"), gang(16, 2, gpus=2)):
        for h in ({}, held):
            assert _outcome(placement.place_gang, spec, fleet, h) == _outcome(reference.place_gang, spec, fleet, h)
    for res in (Resources(), Resources(cuda=True), Resources(gpus=8, zone="z05"), Resources(region="r2"),
                Resources(worker_ids=["w00001", "w00005"]), Resources(gpus=9), Resources(zone="z99")):
        assert _same_route(_outcome(placement.route, res, fleet), _outcome(reference.route, res, fleet))


def test_index_is_built_once_per_snapshot_and_rebuilt_for_a_changed_list():
    clear_cache()
    fleet = _synthetic(50)
    assert index_for(fleet) is index_for(fleet)
    as_list = list(fleet)
    first = index_for(as_list)
    as_list.append(WorkerInfo(id="extra", hostname="x", address="a", slots=1))
    assert index_for(as_list) is not first
    assert "extra" in placement.route(Resources(), as_list).eligible


def test_a_snapshot_with_the_same_layout_inherits_routes_and_refusals():
    from gpulayer.store.registry import _snapshot

    clear_cache()
    fleet = _synthetic(40)
    a = _snapshot(fleet, layout=12345)
    r = placement.route(Resources(zone="z03"), a)
    with pytest.raises(JobRejected):
        placement.route(Resources(zone="z99"), a)
    busier = _snapshot((w.model_copy(update={"busy": 8}) for w in fleet), layout=12345)
    assert index_for(busier).routes == index_for(a).routes
    assert placement.route(Resources(zone="z03"), busier) is r
    with pytest.raises(JobRejected, match="z99"):
        placement.route(Resources(zone="z99"), busier)
    # What depends on busy slots is computed afresh: no gang fits on the busier snapshot.
    with pytest.raises(GangWaiting):
        placement.place_gang(gang(1, 1), busier, {})
    assert placement.place_gang(gang(1, 1), a, {}).workers
