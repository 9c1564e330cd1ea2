"""The registry's packed record layout (``gpulayer/store/packed.py``): round trips, refusals, the layout."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gpulayer.models import WorkerInfo
from gpulayer.store import packed
from gpulayer.store.registry import static_record

text = st.text(max_size=12)
workers = st.builds(WorkerInfo, id=text, hostname=text, address=text, zone=st.none() | text, region=st.none() | text,
                    gpus=st.integers(0, 16), gpu_names=st.lists(text, max_size=4).map(tuple),
                    slots=st.integers(1, 64), busy=st.integers(0, 64), held=st.integers(0, 64),
                    pid=st.integers(0, 2**31), started_at=st.floats(0, 2e9, allow_nan=False) | st.integers(0, 2**31))


def _unpacked(record: str, age: float = 1.5) -> WorkerInfo:
    (w,) = packed.unpack(f"{record}{packed.SEP}{1000.0 - age!r}", 1000.0)
    return w


@given(workers)
def test_a_record_packs_and_unpacks_to_what_its_json_parses_to_or_is_not_packed(w):
    record = packed.pack(w)
    static = static_record(w)
    assert packed.pack_static_json(static) == packed.pack_static(json.loads(static))
    if not record:  # a separator in a string, an empty zone, region or GPU name: read from JSON instead
        texts = [w.id, w.hostname, w.address, *(p for p in (w.zone, w.region) if p is not None), *w.gpu_names]
        assert "" in (w.zone, w.region) or "" in w.gpu_names or any(
            packed.SEP in s or packed.NAMES_SEP in s for s in texts)
        return
    assert record == f"{packed.pack_static_json(static)}{packed.SEP}{w.busy}{packed.SEP}{w.held}"
    got = _unpacked(record)
    want = WorkerInfo.model_validate_json(w.model_copy(update={"heartbeat_age": 1.5}).model_dump_json())
    assert got == want and got.__pydantic_fields_set__ == want.__pydantic_fields_set__
    assert got.model_dump() == want.model_dump() and repr(got) == repr(want)
    assert type(got.started_at) is float and type(got.gpu_names) is tuple


def test_records_of_other_shapes_are_not_packed():
    base = json.loads(static_record(WorkerInfo(id="a", hostname="h", address="x")))
    assert packed.pack_static(base)
    assert packed.pack_static({k: v for k, v in base.items() if k != "pid"}) == ""  # an older record
    assert packed.pack_static({**base, "slots": "8"}) == "" and packed.pack_static({**base, "gpus": True}) == ""
    assert packed.pack_static_json("not json") == "" and packed.pack_static_json("[1]") == ""
    # a field a newer gpulayer adds is ignored, as pydantic ignores it when it parses the JSON
    assert packed.pack_static({**base, "new_field": 1}) == packed.pack_static(base)


def test_the_layout_names_every_field_of_the_model():
    assert set(packed.FIELDS) | set(packed.DYNAMIC) | {"heartbeat_age"} == set(WorkerInfo.model_fields), \
        "WorkerInfo changed: add a packed layout 2 (a new key name in store/keys.py), do not change layout 1"
    assert packed._ORDER == (*packed.FIELDS[:8], *packed.DYNAMIC, *packed.FIELDS[8:], "heartbeat_age"), \
        "unpack's columns must follow the model's field order"


def test_many_records_unpack_in_order_and_share_their_gpu_names():
    ws = [WorkerInfo(id=f"w{i}", hostname="h", address="x", gpus=2, gpu_names=("H100", "H100"), busy=i % 3)
          for i in range(5)]
    text_ = packed.SEP.join(f"{packed.pack(w)}{packed.SEP}999.5" for w in ws)
    got = packed.unpack(text_, 1000.0)
    assert [w.id for w in got] == [w.id for w in ws] and [w.busy for w in got] == [w.busy for w in ws]
    assert got[0].gpu_names is got[4].gpu_names and got[0].heartbeat_age == 0.5
    assert packed.unpack("", 1.0) == []


@given(st.lists(workers, max_size=8, unique_by=lambda w: w.id), st.data())
def test_the_live_records_come_back_sorted_by_id_whatever_the_ids_and_the_hash_order(ws, data):
    records = [r.encode() for r in map(packed.pack, ws) if r]
    packable = [w for w in ws if packed.pack(w)]
    live = data.draw(st.sets(st.sampled_from([w.id for w in packable])) if packable else st.just(set()))
    beats = {wid: 990.0 + i for i, wid in enumerate(sorted(live))}
    got = packed.unpack_live(data.draw(st.permutations(records)), beats, 1000.0)
    assert [w.id for w in got] == sorted(live)  # the dead's records (ids not in beats) are left out
    want = {w.id: w for w in packable}
    assert [w.model_dump(exclude={"heartbeat_age"}) for w in got] == \
        [want[w.id].model_dump(exclude={"heartbeat_age"}) for w in got]
    assert [w.heartbeat_age for w in got] == [1000.0 - beats[w.id] for w in got]


def test_ids_below_the_separator_still_sort_as_strings_and_a_live_id_without_a_record_is_none():
    ws = [WorkerInfo(id=i, hostname="h", address="x") for i in ("a", "a\x01b", "a b")]
    records = [packed.pack(w).encode() for w in ws]  # as bytes "a\x01b..." sorts before "a\x1f..."
    got = packed.unpack_live(list(records), dict.fromkeys(("a", "a\x01b", "a b"), 999.0), 1000.0)
    assert [w.id for w in got] == ["a", "a\x01b", "a b"] and all(w.heartbeat_age == 1.0 for w in got)
    assert packed.unpack_live(list(records), dict.fromkeys(("a", "zz"), 999.0), 1000.0) is None
    assert packed.unpack_live([], {}, 1000.0) == [] and packed.unpack_live([], {"a": 1.0}, 1000.0) is None
