"""The registry's packed records (layout 1): what the full read moves instead of JSON.

At 10,000 workers JSON cost the full read twice: Redis's Lua built 2.5 MB of it and Python
parsed it back into ``WorkerInfo`` (issue 14, item 3). A packed record is a worker's values in
``FIELDS`` order joined by ``SEP`` (``gpu_names`` joined by ``NAMES_SEP``), followed by busy and
held; the heartbeat script stores it beside the JSON record (``keys.WORKERS_PACKED``), and the full
read returns the live ones joined by ``SEP`` with each one's heartbeat time, so Lua concatenates
and Python splits once and fills in objects. A record whose values could not be told apart packed
(a separator inside a string, an empty zone or GPU name) is not packed: it is read from its JSON.

The layout is in the key's name: a new field in ``WorkerInfo`` needs a new layout (a test checks
``FIELDS`` against the model), never a change to this one.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import json
import operator
from collections.abc import Iterable

from ..models import WorkerInfo

LAYOUT = 1
SEP = "\x1f"
NAMES_SEP = "\x1d"
_BYTES_SEP = SEP.encode()
FIELDS = ("id", "hostname", "address", "zone", "region", "gpus", "gpu_names", "slots", "pid", "started_at")
DYNAMIC = ("busy", "held")  # appended by the heartbeat script; the full read appends the heartbeat time
_ALL = set(WorkerInfo.model_fields)  # what a record parsed from the registry's JSON has set
_STRINGS = ("id", "hostname", "address")
_PLACES = ("zone", "region")
_INTS = ("gpus", "slots", "pid")


def pack_static(record: dict) -> str:
    """A static record (``registry.static_record``'s fields, as a dict) packed; ``''`` if it cannot be."""
    try:
        strings = [record[k] for k in _STRINGS]
        places = [record[k] for k in _PLACES]
        ints = [record[k] for k in _INTS]
        names, started = record["gpu_names"], record["started_at"]
    except KeyError:
        return ""
    texts = strings + [p for p in places if p is not None] + list(names)
    if not all(type(s) is str and SEP not in s and NAMES_SEP not in s for s in texts) or "" in places \
            or (names and "" in names) or not all(type(i) is int for i in ints) \
            or type(started) not in (int, float):
        return ""
    gpus, slots, pid = ints
    return SEP.join((*strings, *(p or "" for p in places), str(gpus), NAMES_SEP.join(names), str(slots), str(pid),
                     repr(float(started))))


_memo: dict[str, str] = {}


def pack_static_json(static: str) -> str:
    """``pack_static`` of a static JSON record, remembered: a heartbeat sends the same one every second."""
    out = _memo.get(static)
    if out is None:
        try:
            record = json.loads(static)
        except ValueError:
            record = None
        out = pack_static(record) if isinstance(record, dict) else ""
        if len(_memo) > 100_000:  # an emulator carries 10,000 workers; more is churn
            _memo.clear()
        _memo[static] = out
    return out


def pack(w: WorkerInfo) -> str:
    """The whole packed record of ``w`` (static fields, busy, held), as the heartbeat script stores it."""
    static = pack_static({k: getattr(w, k) for k in FIELDS})
    return static and SEP.join((static, str(w.busy), str(w.held)))


def trusted(fields: dict, fields_set: set | None = None) -> WorkerInfo:
    """A ``WorkerInfo`` of values already of the model's types, without validating them again.

    For values the registry's own scripts produced: pydantic's validation of 10,000 records costs
    more than the read.
    """
    out = _new(WorkerInfo)
    _set_dict(out, fields)
    # One set shared by the records of a read: a frozen model never adds to it, and model_copy copies it first.
    _set_fields_set(out, _ALL if fields_set is None else fields_set)
    _set_extra(out, None)
    _set_private(out, None)
    return out


_new = WorkerInfo.__new__
_WIDTH = len(FIELDS) + len(DYNAMIC) + 1  # and the heartbeat time
_lt = operator.lt
_each = collections.deque(maxlen=0).extend  # runs an iterator to its end, keeping nothing


def _slot_setter(name: str):
    """The setter of one of the model's slots (``__dict__``, ``__pydantic_fields_set__``...), called directly."""
    return next(k.__dict__[name] for k in WorkerInfo.__mro__ if name in k.__dict__).__set__


# pydantic's private layout of a model (BaseModel.__slots__), set here as model_construct sets it: pinned in
# gpulayer/engine/upstream.py, and tests/test_engine_contract.py compares the result with model_construct's.
_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
_set_dict, _set_fields_set, _set_extra, _set_private = map(_slot_setter, _SLOTS)


def _fields(rows: Iterable[tuple]) -> list[dict]:
    """A model's ``__dict__`` per row of values in the model's field order: a dict display in a comprehension,
    the fastest way Python has to make many dicts (half the time of ``dict(zip())``)."""
    return [{"id": a, "hostname": b, "address": c, "zone": d, "region": e, "gpus": f, "gpu_names": g, "slots": h,
             "busy": i, "held": j, "pid": k, "started_at": m, "heartbeat_age": n}
            for a, b, c, d, e, f, g, h, i, j, k, m, n in rows]


def _models(fields: list[dict]) -> list[WorkerInfo]:
    """``trusted`` of each dict, every step a C loop: no Python frame per record (10,000 of them per full read)."""
    n = len(fields)
    out = list(map(_new, itertools.repeat(WorkerInfo, n)))
    _each(map(_set_dict, out, fields))
    # One set shared by the records of a read: a frozen model never adds to it, and model_copy copies it first.
    _each(map(_set_fields_set, out, itertools.repeat(_ALL, n)))
    _each(map(_set_extra, out, itertools.repeat(None, n)))
    _each(map(_set_private, out, itertools.repeat(None, n)))
    return out


def unpack(text: str, now: float) -> list[WorkerInfo]:
    """The full read's packed part: records and heartbeat times joined by ``SEP``; ages from Redis's ``now``."""
    if not text:
        return []
    flat = text.split(SEP)
    if len(flat) % _WIDTH:
        raise ValueError(f"packed registry records: {len(flat)} fields is not a multiple of {_WIDTH}")
    columns = [flat[i::_WIDTH] for i in range(_WIDTH)]
    return _records(columns[:-1], map(float, columns[-1]), now)


def unpack_live(records: list[bytes] | list[str], beats: dict[str, float], now: float) -> list[WorkerInfo] | None:
    """Every packed record (the hash's values, in any order) of a worker in ``beats`` (live id -> heartbeat
    time), sorted by id; ``None`` when a worker of ``beats`` has no packed record (its JSON one must be read).

    A record begins with its id and ``SEP``, so the records sort as bytes in id order (UTF-8 keeps code
    point order) unless an id holds a character below ``SEP``: the ids are checked, and sorted again if so.
    """
    if not records:
        return [] if not beats else None
    records.sort()
    flat = (_BYTES_SEP.join(records).decode() if isinstance(records[0], bytes) else SEP.join(records)).split(SEP)
    width = _WIDTH - 1
    if len(flat) != width * len(records):
        raise ValueError(f"packed registry records: {len(flat)} fields in {len(records)} records of {width}")
    columns = [flat[i::width] for i in range(width)]
    ids = columns[0]
    times = list(map(beats.get, ids))
    if None in times:  # the dead, whose records stay until the janitor buries them
        keep = [i for i, t in enumerate(times) if t is not None]
        columns = [list(map(column.__getitem__, keep)) for column in columns]
        ids, times = columns[0], list(map(times.__getitem__, keep))
    if len(ids) != len(beats):
        return None
    if not all(map(_lt, ids, itertools.islice(ids, 1, None))):
        order = sorted(range(len(ids)), key=ids.__getitem__)
        columns = [list(map(column.__getitem__, order)) for column in columns]
        times = list(map(times.__getitem__, order))
    return _records(columns, times, now)


def _records(columns: list[list[str]], beats: Iterable[float], now: float) -> list[WorkerInfo]:
    ids, hosts, addresses, zones, regions, gpus, names, slots, pids, started, busy, held = columns
    # Workers of a kind share their GPU names, places and small counts: each distinct one is made once.
    gpu_names = {n: tuple(n.split(NAMES_SEP)) if n else () for n in set(names)}
    places = {p: p for p in set(zones).union(regions)}
    places[""] = None
    small = {s: int(s) for s in set(gpus).union(slots, busy, held)}.__getitem__
    ages = [now - beat if beat < now else 0.0 for beat in beats]  # round() cost 15 ms
    rows = zip(ids, hosts, addresses, map(places.__getitem__, zones), map(places.__getitem__, regions),
               map(small, gpus), map(gpu_names.__getitem__, names), map(small, slots), map(small, busy),
               map(small, held), map(int, pids), map(float, started), ages)
    with collector_paused():
        return _models(_fields(rows))


_ORDER = tuple(WorkerInfo.model_fields)  # the order pydantic keeps a model's values in, as unpack's columns
assert all(k == v for k, v in _fields([_ORDER])[0].items()) and tuple(_fields([_ORDER])[0]) == _ORDER, \
    "packed._fields does not name WorkerInfo's fields in their order"


@contextlib.contextmanager
def collector_paused():
    """10,000 records are 30,000 new objects, none in a cycle: without the cyclic collector walking the
    young ones again and again while they are made, the read takes a third less. The full read pauses it
    from the reply on (over RESP3 the heartbeat times alone are 10,000 new lists)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
