"""How long a short id takes to resolve (`gpulayer cancel 7d5d3af3731d`, gpulayer/ids.py), on a big Redis.

One Redis of its own, filled as a busy day leaves it: ``--jobs`` sent-job records (split over 4 client
identities, as the transport records them), as many stored results, ``--gangs`` distributed jobs in the
gangs' index and ``--batches`` batches in theirs. Then, ``--runs`` times each, in seconds (medians):

- a whole job id (one pipelined EXISTS / ZSCORE round trip);
- a 12-character prefix of a job, of a batch and of a distributed job (ZSCAN of the indexes);
- a prefix nothing starts (the indexes, then a SCAN of the stored results: the slow path).

    python benchmarks/id_prefix.py [--jobs 200000] [--gangs 2000] [--batches 2000] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Report, unwind_on_signals, write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--gangs", type=int, default=2_000)
    ap.add_argument("--batches", type=int, default=2_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    unwind_on_signals()
    from gpulayer import app as app_mod
    from gpulayer.ids import resolve
    from gpulayer.lab.fleet import Fleet
    from gpulayer.store import keys

    report = Report("id_prefix")
    fleet = Fleet(Path(tempfile.mkdtemp(prefix="id-prefix-")))
    fleet.start_redis()
    try:
        fleet.connect()
        r = app_mod.app.backend.client
        jobs = [str(uuid.uuid4()) for _ in range(args.jobs)]
        gangs = [uuid.uuid4().hex for _ in range(args.gangs)]
        batches = [str(uuid.uuid4()) for _ in range(args.batches)]
        now = time.time()
        pipe = r.pipeline(transaction=False)
        for start in range(0, len(jobs), 10_000):
            chunk = jobs[start:start + 10_000]
            identity = f"user{start // 10_000 % 4}@bench"
            pipe.zadd(keys.client_jobs(identity), dict.fromkeys(chunk, now))
            pipe.sadd(keys.CLIENTS, identity)
            pipe.mset({app_mod.app.backend.get_key_for_task(j): b"x" for j in chunk})
            pipe.execute()
        pipe.zadd(keys.GANGS, dict.fromkeys(gangs, now))
        pipe.zadd(keys.BATCHES, dict.fromkeys(batches, now))
        pipe.execute()
        report(f"Redis holds {r.dbsize()} keys: {args.jobs} jobs sent (and their results), {args.gangs} distributed "
               f"jobs, {args.batches} batches; {args.runs} runs each, medians")
        cases = {"whole job id": lambda i: jobs[i], "job, 12 characters": lambda i: jobs[i][:12],
                 "batch, 12 characters": lambda i: batches[i][:12], "distributed job, 12 characters":
                 lambda i: gangs[i][:12], "unknown prefix (slow path)": lambda i: f"zz{i:04d}zz"}
        for case, pick in cases.items():
            took = []
            for i in range(args.runs):
                text = pick(i * 7919 % min(len(jobs), len(gangs), len(batches)))
                t0 = time.perf_counter()
                try:
                    resolve(text, r=r)
                except LookupError:
                    pass
                took.append(time.perf_counter() - t0)
            median = statistics.median(took)
            report(f"{case:34s} {median * 1000:9.1f} ms")
            report.result(case, median_ms=median * 1000, jobs=args.jobs)
        print(write_results(report.lines, "id_prefix.txt"))
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
