"""Fair share and a quota on a real fleet: two users with shares 3:1, each with a backlog of short jobs.

    python benchmarks/fair_share.py [--workers 2] [--slots 4] [--job-seconds 1] [--duration 120] [--warmup 20]
                                    [--shares 3:1] [--quota 4] [--quota-jobs 48]

One Redis and ``--workers`` workers of ``--slots`` slots (real processes, loopback). Users ``alice`` and
``bob`` get policies in ``gl:users`` (shares from ``--shares``), then each sends a backlog larger than the fleet
can run in ``--duration`` seconds of ``--job-seconds`` jobs (the issue's case is 10-s jobs over 10 minutes;
the defaults are a scaled one). Every job writes its start and end into Redis. After ``--duration`` seconds the
run stops; over the window from ``--warmup`` to the end it prints each user's mean running slots (slot-seconds
/ window: expect 6 and 2 on 8 slots at 3:1) and its fraction of the slot-seconds (expect 75% / 25%).

Then the quota: user ``carol`` with ``max_slots = --quota`` sends ``--quota-jobs`` jobs onto the idle fleet;
the most of her jobs running at once (from their own start/end times, and sampled from the running count
take.lua keeps) must not exceed the quota, and `gpulayer status`'s fair-share table shows why the rest wait.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import Report, write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer import submit  # noqa: E402
from gpulayer.lab.fleet import Fleet  # noqa: E402
from gpulayer.store import fair, keys  # noqa: E402
from gpulayer import status  # noqa: E402

SPANS = "bench:fair:spans"  # (the benchmark's own list, not a gpulayer key)


def job(user: str, seconds: float, url: str) -> None:
    """Sleep ``seconds`` and record (user, start, end) in the benchmark's list."""
    import json as _json
    import time as _t

    from gpulayer.store.connection import connect_redis

    start = _t.time()
    _t.sleep(seconds)
    connect_redis(url).rpush(SPANS, _json.dumps([user, start, _t.time()]))


def send(user: str, n: int, seconds: float, url: str) -> list:
    return [submit.apply_async((job, user, seconds, url), headers={"gl_client": user}) for _ in range(n)]


def spans(client) -> list[tuple[str, float, float]]:
    return [tuple(json.loads(x)) for x in client.lrange(SPANS, 0, -1)]


def most_at_once(intervals) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    now = best = 0
    for _, d in edges:
        now += d
        best = max(best, now)
    return best


def clipped(intervals, lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in intervals)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=4, help="slots per worker (default 4: 8 in all)")
    p.add_argument("--job-seconds", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of the shares run (default 120)")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds left out of the steady state (default 20)")
    p.add_argument("--shares", default="3:1", help="alice:bob shares (default 3:1)")
    p.add_argument("--quota", type=int, default=4, help="carol's max_slots (default 4)")
    p.add_argument("--quota-jobs", type=int, default=48)
    p.add_argument("--output", default="fair_share.txt")
    args = p.parse_args()
    a_share, b_share = (float(x) for x in args.shares.split(":"))
    slots = args.workers * args.slots
    out = Report("fair_share")
    out(f"# {args.workers} workers x {args.slots} slots, {args.job_seconds:g}-s jobs, {args.duration:g} s "
        f"(steady state after {args.warmup:g} s), shares alice:bob = {a_share:g}:{b_share:g}")
    with tempfile.TemporaryDirectory(prefix="gl-fair-") as tmp, Fleet(Path(tmp), torch=False) as fleet:
        names = [f"fair-{i}" for i in range(args.workers)]
        for name in names:
            fleet.add_worker(name, slots=args.slots, wait=False, tie_to_parent=True)
        fleet.wait_workers(names, timeout=120)
        fleet.connect()
        client = fleet.client()
        client.hset(keys.USERS, mapping={"alice": json.dumps({"share": a_share}),
                                         "bob": json.dumps({"share": b_share}),
                                         "carol": json.dumps({"share": 1, "max_slots": args.quota})})
        fair.forget()
        backlog = int(slots * args.duration / args.job_seconds) + slots
        t0 = time.time()
        for user in ("alice", "bob"):  # (bob's backlog is sent second: first come would favour alice anyway)
            send(user, backlog, args.job_seconds, fleet.url)
        out(f"# sent {backlog} jobs per user in {time.time() - t0:.1f} s")
        samples: list[tuple[int, int]] = []
        while time.time() < t0 + args.duration:
            time.sleep(0.5)
            if time.time() >= t0 + args.warmup:
                running = fair.snapshot(client).running
                samples.append((running["alice"].slots, running["bob"].slots))
        t1 = time.time()
        client.delete(*[k for k in client.scan_iter(match=f"*{keys.USER_SEP}alice")],
                      *[k for k in client.scan_iter(match=f"*{keys.USER_SEP}bob")])  # the rest of the backlogs
        got = spans(client)
        lo, window = t0 + args.warmup, t1 - (t0 + args.warmup)
        per = {u: clipped([(s, e) for who, s, e in got if who == u], lo, t1) for u in ("alice", "bob")}
        total = sum(per.values()) or 1.0
        for u in ("alice", "bob"):
            sampled = sorted(s[0 if u == "alice" else 1] for s in samples)
            out(f"{u}: mean running slots {per[u] / window:.2f} (sampled median {sampled[len(sampled) // 2]}), "
                f"slot-seconds {per[u]:.0f} = {per[u] / total:.1%}")
            out.result(f"steady_{u}", slots=per[u] / window, fraction=per[u] / total)
        expect = a_share / (a_share + b_share)
        out(f"# expected alice {expect * slots:.1f} slots, {expect:.0%}; "
            f"{'within' if abs(per['alice'] / total - expect) <= 0.05 else 'NOT within'} 5 points")
        # Wait for what still runs, then the quota on an idle fleet.
        deadline = time.time() + 60
        while fair.snapshot(client).running["alice"].slots + fair.snapshot(client).running["bob"].slots \
                and time.time() < deadline:
            time.sleep(0.2)
        client.delete(SPANS)
        handles = send("carol", args.quota_jobs, args.job_seconds / 2, fleet.url)
        seen, reasons, done = [], set(), threading.Event()

        def sample():
            per_user: dict[str, int] = {}
            while not done.is_set():
                seen.append(fair.snapshot(client).running["carol"].slots)
                per_user.clear()
                status.queue_lengths(client, set(), per_user)
                for row in status.fair_share(client, per_user) or ():
                    if row["user"] == "carol" and row["reason"]:
                        reasons.add(f"{row['reason']} ({row['waiting']} waiting)")
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for h in handles:
                h.get(timeout=600)
        finally:
            done.set()
            sampler.join()
        time.sleep(0.5)
        intervals = [(s, e) for who, s, e in spans(client) if who == "carol"]
        out(f"quota {args.quota}: {len(intervals)} jobs, most running at once {most_at_once(intervals)} (from the "
            f"jobs' own times), most sampled {max(seen)}; "
            f"{'never exceeded' if max(most_at_once(intervals), max(seen)) <= args.quota else 'EXCEEDED'}")
        out.result("quota", limit=args.quota, most=most_at_once(intervals), sampled=max(seen))
        for reason in sorted(reasons)[:3]:
            out(f"  status said: {reason}")
    print(f"\nwritten to {write_results(out.lines, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
