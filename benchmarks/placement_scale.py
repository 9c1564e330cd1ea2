"""Placement and registry reads at fleet scale: the indexed placement against the previous one, side by side.

Synthetic fleets of 10, 100, 1,000 and 10,000 workers (8 slots each, 30 zones in 10 regions,
every fifth worker with 8 GPUs, one host per worker, a fixed random mix of busy slots):

- ``index build``: ``SnapshotIndex(workers)`` grouped by id, zone, region and GPUs, paid once per snapshot object;
- ``route``: CPU and CUDA, free and zone-pinned, on a snapshot already indexed (what a client
  does between refreshes), against ``tests/placement_reference.py`` (the implementation before
  the index) on the same inputs;
- ``place_gang``: 2 x 2, 16 x 4 and 64 x 8, CPU and CUDA, free and zone-pinned; ``warm`` with an
  empty slot ledger, ``ledger`` with 1% of the workers holding 4 slots (the zones those touch are
  looked at again), ``cold`` on a fresh snapshot (index build and every group's first pick
  included), against the reference;
- ``snapshot``: from a real Redis (started on a free port, stopped by pid) holding the fleet's
  heartbeats: the full read (``Registry.read``, packed records: ``gpulayer/store/packed.py``)
  against the previous one (the JSON records, one array parsed by pydantic), and the one before
  (one HGET per worker in Lua, one pydantic parse per record); where the full read's time goes
  (Redis's CPU per call from ``INFO commandstats``, the bytes moved, the parse in Python); and
  ``FleetView.refresh`` after nothing changed, after 1% and 10% of the workers changed their busy
  count, and after 1% re-registered with new records.

Median and p99 per call in milliseconds; every figure is printed and written to
``results/<date>-<host>/placement_scale.txt``.

    python benchmarks/placement_scale.py [--sizes 10,100,1000,10000] [--repeat 200] [--no-redis | --redis-only]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import result_line, unwind_on_signals, write_results  # same folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpulayer import placement  # noqa: E402
from gpulayer.errors import JobRejected  # noqa: E402
from gpulayer.models import GangSpec, Resources, WorkerInfo  # noqa: E402
from gpulayer.placement_index import SnapshotIndex, clear_cache  # noqa: E402
from tests import placement_reference as reference  # noqa: E402

GOALS = {"route": 0.05, "place_gang 16x4": 1.0, "full snapshot": 50.0, "incremental refresh": 5.0}

OLD_SNAPSHOT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf', 'WITHSCORES')
local out = {tostring(now)}
for i = 1, #live, 2 do
  local info = redis.call('HGET', KEYS[2], live[i])
  if info then
    table.insert(out, live[i + 1])
    table.insert(out, info)
  end
end
return out
"""


def synthetic_fleet(n: int, seed: int = 1) -> tuple[WorkerInfo, ...]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        z = i % 30
        gpus = 8 if i % 5 == 0 else 0
        out.append(WorkerInfo(id=f"w{i:05d}", hostname=f"host{i:05d}", address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                              zone=f"zone-{z:02d}", region=f"region-{z // 3}", gpus=gpus,
                              gpu_names=("NVIDIA H100 80GB HBM3",) * gpus, slots=8,
                              busy=rng.choice([0, 0, 0, 1, 2, 3, 4, 6, 8]), pid=10000 + i, started_at=1.76e9))
    return tuple(out)


def timed(fn, repeat: int, clock=time.perf_counter) -> list[float]:
    """Milliseconds per call, ``repeat`` calls (``clock=time.process_time``: this process's CPU time)."""
    out = []
    for _ in range(repeat):
        t = clock()
        fn()
        out.append((clock() - t) * 1e3)
    return out


def stats(ms: list[float]) -> tuple[float, float]:
    ms = sorted(ms)
    return statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]


def outcome(fn):
    try:
        fn()
        return "ok"
    except (JobRejected, placement.GangWaiting, reference.GangWaiting) as err:
        return "waits" if "waiting" in str(err) else "rejected"


class Table:
    def __init__(self, out: list[str]):
        self.out = out
        self.results: list[str] = []  # `result {json}` per row, written at the end for scripts/make_perf_charts.py

    def header(self, title: str) -> None:
        self.line("")
        self.line(title)
        self.line(f"{'what':<44} {'workers':>7} {'median ms':>10} {'p99 ms':>9} {'before ms':>10} {'speed-up':>9}  result")

    def row(self, what: str, n: int, ms: list[float], before: list[float] | None = None, result: str = "") -> None:
        med, p99 = stats(ms)
        if before:
            bmed = stats(before)[0]
            extra = f"{bmed:>10.4f} {bmed / med if med else float('inf'):>8.1f}x"
        else:
            extra = f"{'':>10} {'':>9}"
        self.line(f"{what:<44} {n:>7} {med:>10.4f} {p99:>9.4f} {extra}  {result}")
        self.results.append(result_line("placement_scale", what, workers=n, median_ms=round(med, 5), p99_ms=round(p99, 5),
                                        before_ms=round(stats(before)[0], 5) if before else None, result=result or None))

    def line(self, s: str) -> None:
        print(s, flush=True)
        self.out.append(s)


ROUTES = {
    "cpu": Resources(),
    "cuda": Resources(cuda=True),
    "cpu zone-pinned": Resources(zone="zone-05"),
    "cuda zone-pinned": Resources(cuda=True, zone="zone-05"),
}
GANGS = [(2, 2), (16, 4), (64, 8)]


def bench_placement(t: Table, n: int, repeat: int) -> None:
    fleet = synthetic_fleet(n)
    reps_ref = max(5, min(repeat, 20000 // max(n, 1)))
    t.header(f"{n} workers")
    t.row("index build", n, timed(lambda: SnapshotIndex(fleet)._build(), max(5, min(repeat, 50000 // n))))
    placement.route(Resources(), fleet)  # index it once
    for name, res in ROUTES.items():
        got = outcome(lambda: placement.route(res, fleet))
        t.row(f"route {name}", n, timed(lambda: outcome(lambda: placement.route(res, fleet)), repeat * 5),
              timed(lambda: outcome(lambda: reference.route(res, fleet)), reps_ref), got)
    rng = random.Random(2)
    ledger = {w.id: 4 for w in rng.sample(fleet, max(1, n // 100))}
    for nodes, procs in GANGS:
        for kind, res in (("cpu", Resources()), ("cuda", Resources(cuda=True)), ("cpu zone-pinned", Resources(zone="zone-05")),
                          ("cuda zone-pinned", Resources(cuda=True, zone="zone-05"))):
            spec = GangSpec(gang_id="g", nodes=nodes, procs_per_node=procs, resources=res)
            label = f"place_gang {nodes}x{procs} {kind}"
            got = outcome(lambda: placement.place_gang(spec, fleet, {}))
            t.row(f"{label} warm", n, timed(lambda: outcome(lambda: placement.place_gang(spec, fleet, {})), repeat),
                  timed(lambda: outcome(lambda: reference.place_gang(spec, fleet, {})), reps_ref), got)
            got = outcome(lambda: placement.place_gang(spec, fleet, ledger))
            t.row(f"{label} ledger", n, timed(lambda: outcome(lambda: placement.place_gang(spec, fleet, ledger)), repeat),
                  timed(lambda: outcome(lambda: reference.place_gang(spec, fleet, ledger)), reps_ref), got)

            def cold():
                fresh = tuple(list(fleet))  # a new snapshot object: nothing cached for it
                outcome(lambda: placement.place_gang(spec, fresh, ledger))
            t.row(f"{label} cold", n, timed(cold, max(3, reps_ref // 2)), None, got)
    clear_cache()


def bench_snapshot(t: Table, n: int, repeat: int) -> None:
    from gpulayer.store import keys
    from gpulayer.store import packed
    from gpulayer.store.registry import _RECORDS, _SNAP_KEYS, FleetView, Registry, static_record
    from gpulayer.lab.fleet import Fleet

    fleet = list(synthetic_fleet(n))
    statics = {w.id: static_record(w) for w in fleet}
    with tempfile.TemporaryDirectory() as tmp, Fleet(Path(tmp), password=None) as redis_fleet:
        client = redis_fleet.client()
        reg = Registry(client, dead_after=600.0)  # nobody dies while we measure
        reg.heartbeat_many(fleet, statics)
        t.header(f"snapshot from a real Redis, {n} workers (redis {client.info('server')['redis_version']})")
        old = client.register_script(OLD_SNAPSHOT_LUA)

        def old_read():
            raw = old(keys=[keys.WORKERS, keys.WORKERS_INFO], args=[600.0])
            now = float(raw[0])
            ws = [WorkerInfo.model_validate_json(i).model_copy(update={"heartbeat_age": max(0.0, now - float(s))})
                  for s, i in zip(raw[1::2], raw[2::2])]
            return tuple(sorted(ws, key=lambda w: w.id))

        # The previous full read: the same script with the packed records out of sync (a key that never
        # matches the version) returns every record as JSON, parsed as Registry.read parsed it before.
        never = f"{keys.NAMESPACE}:bench:never-synced"
        client.set(never, "-1")
        json_keys = [*_SNAP_KEYS[:-1], never]

        def json_call():
            return reg._snap(keys=json_keys, args=[600.0])

        def json_read():
            return tuple(sorted(_RECORDS.validate_json(json_call()[4]), key=lambda w: w.id))

        def packed_call():
            return reg._snap(keys=_SNAP_KEYS, args=[600.0])

        def script_read():  # the packed read through snapshot.lua, as Registry.read did before its direct read
            raw = packed_call()
            return tuple(sorted(packed.unpack(raw[3].decode(), float(raw[0])), key=lambda w: w.id))

        assert [w.model_dump(exclude={"heartbeat_age"}) for w in reg.read()[1]] == \
               [w.model_dump(exclude={"heartbeat_age"}) for w in json_read()], "the packed read differs from JSON"
        reps = max(3, min(repeat, 100000 // n))
        assert reg._read_packed() is not None, "the full read did not take its direct path"
        assert [w.model_dump(exclude={"heartbeat_age"}) for w in reg.read()[1]] == \
               [w.model_dump(exclude={"heartbeat_age"}) for w in script_read()], "the direct read differs"
        t.row("full read (Registry.read: direct, packed)", n, timed(reg.read, reps), timed(script_read, reps))
        t.row("full read by snapshot.lua (packed)", n, timed(script_read, reps), timed(json_read, reps))
        t.row("full read before the packed records (JSON)", n, timed(json_read, reps), timed(old_read, reps))
        for what, call, command in (("direct", reg._read_packed, "cmdstat_exec"), ("packed", packed_call, "cmdstat_evalsha"),
                                    ("JSON", json_call, "cmdstat_evalsha")):
            client.config_resetstat()
            wall = timed(call, reps)
            stat = client.info("commandstats").get(command, {})
            name = "read (MULTI)" if what == "direct" else "script"
            t.line(f"  {what:<6} {name:<12}: {stat.get('usec_per_call', 0) / 1e3:7.1f} ms of Redis CPU per call, "
                   f"{stats(wall)[0]:7.1f} ms call, transfer{' and parse' if what == 'direct' else ''}")
        raw = packed_call()
        text, now = raw[3].decode(), float(raw[0])
        blob = json_call()[4]
        cpu = time.process_time  # the parse is this process's CPU alone: a loaded machine inflates its wall time
        t.row("  parse: packed (store/packed.unpack), CPU ms", n, timed(lambda: packed.unpack(text, now), reps, cpu),
              timed(lambda: _RECORDS.validate_json(blob), reps, cpu))
        t.row("  parse: JSON (pydantic, one array), CPU ms", n, timed(lambda: _RECORDS.validate_json(blob), reps, cpu))
        t.row("heartbeat of every worker (batched)", n, timed(lambda: reg.heartbeat_many(fleet, statics), reps))
        view = FleetView(reg)
        view.refresh()
        t.row("refresh, nothing changed", n, timed(view.refresh, reps * 5))
        rng = random.Random(3)
        for share, what in ((0.01, "busy counts"), (0.10, "busy counts"), (0.01, "records")):
            k = max(1, int(n * share))
            samples = []
            for _ in range(reps):
                changed = rng.sample(fleet, k)
                if what == "records":
                    beat = [w.model_copy(update={"gpu_names": w.gpu_names + ("x",)}) for w in changed]
                    reg.heartbeat_many(beat)
                else:
                    beat = [w.model_copy(update={"busy": (w.busy + rng.randint(1, 7)) % 9}) for w in changed]
                    reg.heartbeat_many(beat, statics)
                t0 = time.perf_counter()
                view.refresh()
                samples.append((time.perf_counter() - t0) * 1e3)
            t.row(f"refresh after {share:.0%} changed {what}", n, samples)
        assert view.full_reads == 1, "a refresh fell back to a full read"
        assert [w.model_dump(exclude={"heartbeat_age"}) for w in view.refresh()] == \
               [w.model_dump(exclude={"heartbeat_age"}) for w in reg.snapshot()], "the incremental view drifted"
        client.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,100,1000,10000")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--no-redis", action="store_true", help="skip the snapshot reads from a real Redis")
    p.add_argument("--redis-only", action="store_true", help="only the snapshot reads from a real Redis")
    args = p.parse_args()
    unwind_on_signals()
    out: list[str] = []
    t = Table(out)
    t.line(f"placement_scale.py  {time.strftime('%Y-%m-%d %H:%M:%S')}  python {platform.python_version()}  "
           f"{os.cpu_count()} CPUs  load average {os.getloadavg()[0]:.1f}")
    t.line("median and p99 per call; 'before' = the implementation before the index (tests/placement_reference.py) "
           "or the previous full snapshot read; result: ok / waits (GangWaiting) / rejected")
    sizes = [int(s) for s in args.sizes.split(",")]
    for n in sizes if not args.redis_only else ():
        bench_placement(t, n, args.repeat)
    if not args.no_redis:
        for n in sizes:
            if n >= 1000:
                bench_snapshot(t, n, args.repeat)
    t.line("")
    for line in t.results:
        t.line(line)
    t.line(f"goals at 10,000 workers (ms): {GOALS}")
    t.line(f"load average at the end {os.getloadavg()[0]:.1f} (the figures above are noisy when it is high)")
    print("wrote", write_results(out, "placement_scale_registry.txt" if args.redis_only else "placement_scale.txt"))


if __name__ == "__main__":
    main()
