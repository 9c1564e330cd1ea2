"""submit_batch's first chunk: small (64 jobs, then doubling) against one chunk of ``batch_chunk_size`` first.

    python benchmarks/first_chunk.py [--jobs 2000] [--rounds 8] [--slots 2]

One Redis and one worker with ``--slots`` slots (free loopback ports). Each round times ``submit_batch`` of
``--jobs`` ``square(i)`` then ``.get()`` both ways, in alternating order, in this one process
(``gpulayer.client.FIRST_CHUNK`` set to 64, the default, or to 1,000, which is what every chunk was before).
Prints each way's jobs/s per round and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import write_results  # same folder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.lab.fleet import Fleet  # noqa: E402


def square(x: int) -> int:
    return x * x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--slots", type=int, default=2)
    a = ap.parse_args()
    out = [f"# python benchmarks/first_chunk.py {' '.join(sys.argv[1:])}"]
    with tempfile.TemporaryDirectory(prefix="gl-chunk-") as tmp, Fleet(Path(tmp), appendonly=False) as fleet:
        fleet.add_worker("c1", slots=a.slots, wait=False, torch=False)
        fleet.wait_workers(["c1"])
        fleet.connect()
        import gpulayer.client as client
        from gpulayer import submit, submit_batch

        default = client.FIRST_CHUNK
        submit_batch([submit.s(square, i) for i in range(500)]).get(timeout=60)  # warm-up
        rates: dict[int, list[float]] = {default: [], 1000: []}
        for r in range(a.rounds):
            for first in ((default, 1000) if r % 2 == 0 else (1000, default)):
                client.FIRST_CHUNK = first
                time.sleep(0.3)
                t = time.perf_counter()
                submit_batch([submit.s(square, i) for i in range(a.jobs)]).get(timeout=120)
                rates[first].append(a.jobs / (time.perf_counter() - t))
        client.FIRST_CHUNK = default
    for first, values in rates.items():
        line = (f"first chunk {first:>4}: median {statistics.median(values):,.0f} jobs/s over {a.rounds} rounds "
                f"({', '.join(f'{v:,.0f}' for v in values)})")
        print(line)
        out.append(line)
    print(f"\nwritten to {write_results(out, 'first_chunk.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
