"""The object store's local backend against the disk's raw bandwidth: one 1 GB tensor written and read back.

Side by side, in one run, the same bytes:

- raw write: ``open(path, "wb").write(buffer)`` of a 1 GB bytes buffer (no fsync: both sides land in the page
  cache; ``os.sync()`` between measurements, untimed, so no write pays for the one before's writeback);
  raw read: ``readinto`` a 1 GB buffer allocated (and faulted in) beforehand, then one pass over it (a torch
  ``max`` over its bytes, the same single pass on both sides; the pass alone is printed too);
- gpulayer write: ``format.prepare`` + ``LocalDir.writer`` (what ``gpulayer.put`` does before its Redis record);
  gpulayer read: ``format.load`` (a copy-on-write map, no copy) and the same pass over the tensor's bytes.

    python benchmarks/object_disk.py [--gb 1] [--runs 5] [--dir /some/disk]

The issue's goal: gpulayer within 2x of the raw bandwidth for 1 GB (write and read).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.common import result_line, write_results  # noqa: E402
from gpulayer.objects import format as fmt  # noqa: E402
from gpulayer.objects.backends import LocalDir  # noqa: E402

SECRET = b"bench"


def touch(t: torch.Tensor) -> int:
    """One pass over every byte (what a job reading its input does at least once)."""
    return int(t.view(torch.uint8).max())


def raw_write(path: Path, buf: bytes) -> float:
    start = time.perf_counter()
    with open(path, "wb") as f:
        f.write(buf)
    return time.perf_counter() - start


def raw_read(path: Path, out: bytearray) -> float:
    view = memoryview(out)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < len(out):
            got += f.readinto(view[got:])
    touch(torch.frombuffer(out, dtype=torch.uint8))
    return time.perf_counter() - start


def pass_alone(t: torch.Tensor) -> float:
    start = time.perf_counter()
    touch(t)
    return time.perf_counter() - start


def gl_write(store: LocalDir, oid: str, t: torch.Tensor) -> float:
    start = time.perf_counter()
    prepared = fmt.prepare(t, SECRET)
    with store.writer(oid) as f:
        prepared.write_to(f.write)
    return time.perf_counter() - start


def gl_read(store: LocalDir, oid: str) -> tuple[float, float]:
    start = time.perf_counter()
    t = fmt.load(store.local_path(oid), SECRET)
    mapped = time.perf_counter() - start
    touch(t)
    return mapped, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="a directory on the disk to measure (default: the temp dir)")
    args = ap.parse_args()
    size = int(args.gb * 1e9) // 4 * 4
    work = Path(tempfile.mkdtemp(prefix="gl-objbench-", dir=args.dir))
    lines = []
    try:
        t = torch.randint(0, 255, (size // 4,), dtype=torch.int32)
        raw = bytes(t.view(torch.uint8).numpy())  # the same bytes, as a plain buffer
        store = LocalDir(str(work / "store"))
        out = bytearray(raw)  # the raw read's destination, its pages faulted in already
        rw, rr, gw, gm, gr, pa = [], [], [], [], [], []
        for i in range(args.runs):
            oid = f"{i:032x}"
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):  # each goes first in every other run
                os.sync()
                if side == 0:
                    rw.append(raw_write(work / "raw", raw))
                else:
                    gw.append(gl_write(store, oid, t))
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                if side == 0:
                    rr.append(raw_read(work / "raw", out))
                else:
                    m, r = gl_read(store, oid)
                    gm.append(m)
                    gr.append(r)
            pa.append(pass_alone(t))
            (work / "raw").unlink()
            store.delete(oid)
        gbs = lambda s: size / statistics.median(s) / 1e9  # noqa: E731
        lines.append(f"{size / 1e9:.2f} GB tensor, {args.runs} runs (median), in {work}")
        lines.append(f"write: raw {gbs(rw):.2f} GB/s, gpulayer {gbs(gw):.2f} GB/s (x{gbs(gw) / gbs(rw):.2f} of raw)")
        lines.append(f"read+pass: raw {gbs(rr):.2f} GB/s, gpulayer {gbs(gr):.2f} GB/s (x{gbs(gr) / gbs(rr):.2f} of "
                     f"raw); gpulayer's load alone (map, no copy) {statistics.median(gm) * 1e3:.1f} ms; the pass alone "
                     f"{gbs(pa):.2f} GB/s")
        lines.append(result_line("object_disk", "1GB", raw_write_gbs=round(gbs(rw), 3), gl_write_gbs=round(gbs(gw), 3),
                                 raw_read_gbs=round(gbs(rr), 3), gl_read_gbs=round(gbs(gr), 3),
                                 gl_load_ms=round(statistics.median(gm) * 1e3, 2), pass_gbs=round(gbs(pa), 3)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    print("wrote", write_results(lines, "object_disk.txt"))


if __name__ == "__main__":
    main()
