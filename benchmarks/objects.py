"""Large data between jobs: gpulayer's object store against the machine's raw bandwidth and Ray's object store.

One run, one process tree, everything on this machine (loopback only), stopped by pid at the end:

- **ceiling** (the physical limit, measured first in the same run): the local disk writing ``--size`` bytes to a
  file in the store's directory and reading them back (page cache included, as the store's own files are), and
  loopback TCP carrying ``--size`` bytes through one socket pair (what a remote host's fetch would cross).
- **gpulayer**: a Redis and ``--workers`` workers x ``--slots`` (``gpulayer.lab.fleet.Fleet``), the object store
  ``--store`` (default a directory in the run's folder, i.e. a shared file system path; ``s3://...`` for an
  S3-compatible server reached through the AWS_* environment), three cases:

  - ``broadcast``: ``ref = gpulayer.put(t)`` (t a ``--size`` float32 tensor) passed to ``--jobs`` jobs, each
    reading every page of it; time from the put to every job's answer.
  - ``result``: one job returns a ``--size`` tensor; time from the submit to the value in the client with every
    page read.
  - ``shards``: ``--shards`` jobs, each given its own ``--shard-size`` input and returning an output of the same
    size (``x + 1``); ``--window`` jobs in flight; each output is read by the client, then freed with its input
    (``h.forget()``, ``gpulayer.free``), so the disk holds at most ``--window`` inputs and outputs.

  Redis ``used_memory`` is sampled every 20 ms in a thread through each case: before, peak, after.
- **ray**: the same three cases with ``ray.put`` + ``@ray.remote`` tasks on a local Ray (``ray.init(num_cpus=
  workers x slots)``) in this process, when ``import ray`` works (run the script with the benchmark venv's Python,
  as ``make bench-ray`` runs throughput.py; without Ray that side is skipped and the log says why).

Every case runs ``--rounds`` times after a warm-up round of small sizes, the sides in rotating order; medians
are quoted. Throughput is the bytes the case moves (broadcast: size x jobs read; result: size; shards:
shards x (input + output)) over its median wall time. The ceiling of a case is the time the raw disk needs to
write what the case writes once and read what its readers read (broadcast: 1 write + jobs reads; result:
1 + 1; shards: shards x 2 writes + 2 reads of a shard), so ``/ ceiling`` is at most 1 and the issue's goal is
``>= 0.5`` for the 1 GB cases; ``/ ray`` is gpulayer's rate over Ray's (goal ``>= 1`` for the shards).

    PYTHONPATH=$PWD .venv-bench/bin/python benchmarks/objects.py [--size 1GB] [--shards 2000] [--shard-size 50MB]
        [--jobs 8] [--workers 2] [--slots 1] [--rounds 3] [--store DIR|s3://bucket/prefix] [--output objects.txt]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from common import Report, unwind_on_signals, write_results  # same folder

PAGE = 4096
GET_TIMEOUT = 900.0
WORKER_READY_TIMEOUT = 120.0
CASES = ("broadcast", "result", "shards")
RAY_PIP = "`make bench-ray`, or pip install -e '.[bench,bench-ray]' (ray==2.58.0) in a venv of its own (benchmarks/README.md)"
GIB = 2**30


# --- what the jobs run, the same on every side (sent by value) -----------------------------------

def touch(t) -> float:
    """Read every page of ``t`` (one float of each): the cost of getting the bytes, not of computing on them."""
    flat = t.reshape(-1)
    return float(flat[:: PAGE // flat.element_size()].sum())


def make(n: int):
    """A tensor of ``n`` float32 ones, returned by the ``result`` job."""
    import torch

    t = torch.ones(n, dtype=torch.float32)
    return t


def shard(x):
    """A shard job: reads its input, writes an output of the same size."""
    return x + 1


def _elems(nbytes: int) -> int:
    return max(PAGE // 4, nbytes // 4)


# --- the ceiling -----------------------------------------------------------------------------

def disk_rates(folder: Path, nbytes: int) -> tuple[float, float]:
    """(write s, read s) of ``nbytes`` to a new file in ``folder`` and back into memory; the file is removed."""
    import torch

    data = torch.ones(_elems(nbytes)).numpy()
    path = folder / f"ceiling-{os.getpid()}.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:  # unbuffered-size writes straight from the array's memory, as the store writes
        f.write(memoryview(data).cast("B"))
    t_write = time.perf_counter() - t0
    back = bytearray(data.nbytes)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        view, done = memoryview(back), 0
        while done < len(back):
            done += f.readinto(view[done:])
    t_read = time.perf_counter() - t0
    path.unlink()
    return t_write, t_read


def loopback_seconds(nbytes: int, chunk: int = 4 * 2**20) -> float:
    """Seconds to send ``nbytes`` over one TCP connection on 127.0.0.1 (sender in a thread; both sides release the
    GIL in sendall/recv_into)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    payload = memoryview(bytearray(chunk))

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as c:
            left = nbytes
            while left > 0:
                n = min(left, chunk)
                c.sendall(payload[:n])
                left -= n

    sender = threading.Thread(target=send, daemon=True)
    t0 = time.perf_counter()
    sender.start()
    conn, _ = server.accept()
    buf = memoryview(bytearray(chunk))
    got = 0
    with conn:
        while got < nbytes:
            n = conn.recv_into(buf)
            if not n:
                raise RuntimeError(f"loopback sender closed after {got} of {nbytes} bytes")
            got += n
    elapsed = time.perf_counter() - t0
    sender.join()
    server.close()
    return elapsed


# --- Redis memory --------------------------------------------------------------------------------

class RedisMemory:
    """``used_memory`` sampled every 20 ms in a thread while the block runs: ``before``, ``peak``, ``after``."""

    EVERY = 0.02

    def __init__(self, client):
        self.client = client
        self.before = self.peak = self.after = 0
        self._stop = threading.Event()

    def _used(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def _run(self) -> None:
        while not self._stop.wait(self.EVERY):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> RedisMemory:
        self.before = self.peak = self._used()
        self._thread = threading.Thread(target=self._run, daemon=True, name="redis-memory")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.after = self._used()
        self.peak = max(self.peak, self.after)


# --- the gpulayer side -------------------------------------------------------------------------

class GpulayerSide:
    name = "gpulayer"

    def __init__(self, fleet):
        import gpulayer

        self.gl = gpulayer
        self.fleet = fleet
        self.redis = fleet.client()
        self.memory: dict[str, list[tuple[int, int, int]]] = {c: [] for c in CASES}

    def _measured(self, case: str, fn, *args):
        with RedisMemory(self.redis) as mem:
            out = fn(*args)
        self.memory[case].append((mem.before, mem.peak, mem.after))
        return out

    def broadcast(self, nbytes: int, jobs: int) -> float:
        return self._measured("broadcast", self._broadcast, nbytes, jobs)

    def result(self, nbytes: int) -> float:
        return self._measured("result", self._result, nbytes)

    def shards(self, n: int, nbytes: int, window: int) -> float:
        return self._measured("shards", self._shards, n, nbytes, window)

    def _broadcast(self, nbytes: int, jobs: int) -> float:
        from gpulayer import group, submit

        t = make(_elems(nbytes))
        expected = touch(t)
        t0 = time.perf_counter()
        ref = self.gl.put(t)
        got = group(submit.s(touch, ref) for _ in range(jobs)).apply_async().get(timeout=GET_TIMEOUT)
        elapsed = time.perf_counter() - t0
        self.gl.free(ref)
        _check(got == [expected] * jobs, f"gpulayer broadcast: {got[:3]} != {expected}")
        return elapsed

    def _result(self, nbytes: int) -> float:
        from gpulayer import submit

        t0 = time.perf_counter()
        h = submit.delay(make, _elems(nbytes))
        value = h.get(timeout=GET_TIMEOUT)
        total = touch(value)
        elapsed = time.perf_counter() - t0
        _check(total == len(range(0, _elems(nbytes), PAGE // 4)), f"gpulayer result: sum {total}")
        del value
        h.forget()
        return elapsed

    def _shards(self, n: int, nbytes: int, window: int) -> float:
        from gpulayer import submit

        inflight: deque = deque()

        def finish() -> None:
            h, ref, i = inflight.popleft()
            out = h.get(timeout=GET_TIMEOUT)
            _check(float(out[0]) == i + 1.0 and float(out[-1]) == i + 1.0, f"gpulayer shard {i}: {out[:2]}")
            del out
            h.forget()
            self.gl.free(ref)

        t0 = time.perf_counter()
        for i in range(n):
            ref = self.gl.put(_filled(nbytes, i))
            inflight.append((submit.delay(shard, ref), ref, i))
            if len(inflight) >= window:
                finish()
        while inflight:
            finish()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.redis.close()


# --- the Ray side ------------------------------------------------------------------------------

def import_ray():
    """``(ray, None)``, or ``(None, why)``."""
    try:
        import ray
    except Exception as err:  # ImportError, or a broken install failing on import
        return None, f"import ray failed ({type(err).__name__}: {err})"
    return ray, None


class RaySide:
    """A local Ray of ``num_cpus`` CPUs started in this process (its processes are this one's children, tied to
    it); ``ray.put`` + tasks for each case."""

    name = "ray"

    def __init__(self, ray, num_cpus: int, temp_dir: Path, object_store_bytes: int):
        self.ray = ray
        for attempt in range(1, 4):
            try:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                         object_store_memory=object_store_bytes, _temp_dir=str(temp_dir))
                break
            except Exception as err:  # its raylet must register within 30 s, which a loaded machine can miss
                ray.shutdown()
                if attempt == 3:
                    raise
                print(f"# ray.init failed ({err}); attempt {attempt + 1} of 3", flush=True)
        unwind_on_signals()  # ray.init installs its own SIGTERM handler
        self.touch = ray.remote(touch)
        self.make = ray.remote(make)
        self.shard = ray.remote(shard)

    def broadcast(self, nbytes: int, jobs: int) -> float:
        t = make(_elems(nbytes))
        expected = touch(t)
        t0 = time.perf_counter()
        ref = self.ray.put(t)
        got = self.ray.get([self.touch.remote(ref) for _ in range(jobs)], timeout=GET_TIMEOUT)
        elapsed = time.perf_counter() - t0
        del ref
        _check(got == [expected] * jobs, f"ray broadcast: {got[:3]} != {expected}")
        return elapsed

    def result(self, nbytes: int) -> float:
        t0 = time.perf_counter()
        ref = self.make.remote(_elems(nbytes))
        value = self.ray.get(ref, timeout=GET_TIMEOUT)
        total = touch(value)
        elapsed = time.perf_counter() - t0
        _check(total == len(range(0, _elems(nbytes), PAGE // 4)), f"ray result: sum {total}")
        del value, ref
        return elapsed

    def shards(self, n: int, nbytes: int, window: int) -> float:
        inflight: deque = deque()

        def finish() -> None:
            out_ref, in_ref, i = inflight.popleft()
            out = self.ray.get(out_ref, timeout=GET_TIMEOUT)
            _check(float(out[0]) == i + 1.0 and float(out[-1]) == i + 1.0, f"ray shard {i}: {out[:2]}")
            del out, out_ref, in_ref  # the last references: Ray frees both objects

        t0 = time.perf_counter()
        for i in range(n):
            in_ref = self.ray.put(_filled(nbytes, i))
            inflight.append((self.shard.remote(in_ref), in_ref, i))
            if len(inflight) >= window:
                finish()
        while inflight:
            finish()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.ray.shutdown()


def _filled(nbytes: int, value: int):
    import torch

    return torch.full((_elems(nbytes),), float(value), dtype=torch.float32)


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"wrong values: {what}")


# --- the run -----------------------------------------------------------------------------------

def _size(text: str) -> int:
    from gpulayer.config import parse_size

    try:
        value = int(parse_size(text, "size"))
    except Exception as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if value < PAGE:
        raise argparse.ArgumentTypeError(f"{text!r}: at least {PAGE} bytes")
    return value


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _versions(ray) -> str:
    import torch

    return (f"python {platform.python_version()}, torch {torch.__version__}, "
            f"ray {ray.__version__ if ray else '-'}")


def disk_check(folder: Path, args: argparse.Namespace, out: Report) -> None:
    """Print the free space where the objects go and what the run needs at most; refuse a run that cannot fit."""
    free = shutil.disk_usage(folder).free
    # the ceiling's file, the broadcast's object and the result's, then the shards in flight (input + output)
    need = 2 * args.size + 2 * args.window * args.shard_size + GIB
    out(f"# disk: {free / GIB:.1f} GiB free in {folder}; this run needs at most {need / GIB:.1f} GiB there "
        f"(each shard's output is freed once read, with its input: at most {args.window} of each at once)")
    if free < need:
        raise SystemExit(f"not enough disk in {folder}: {free / GIB:.1f} GiB free, {need / GIB:.1f} GiB needed; "
                         "give --size, --shard-size or --window smaller values, or a --store on a larger disk")


def run_case(side, case: str, args: argparse.Namespace, small: bool = False) -> float:
    size = PAGE * 256 if small else args.size
    if case == "broadcast":
        return side.broadcast(size, args.jobs)
    if case == "result":
        return side.result(size)
    return side.shards(min(args.shards, 4) if small else args.shards, PAGE * 256 if small else args.shard_size,
                       args.window)


def moved(case: str, args: argparse.Namespace) -> int:
    """The bytes a case delivers (its throughput's numerator)."""
    return {"broadcast": args.size * args.jobs, "result": args.size,
            "shards": args.shards * 2 * args.shard_size}[case]


def ceiling_seconds(case: str, args: argparse.Namespace, write_bps: float, read_bps: float) -> float:
    """The raw disk's time for what the case writes once and reads once per reader."""
    if case == "broadcast":
        return args.size / write_bps + args.jobs * args.size / read_bps
    if case == "result":
        return args.size / write_bps + args.size / read_bps
    return args.shards * 2 * args.shard_size * (1 / write_bps + 1 / read_bps)


def benchmark(args: argparse.Namespace) -> list[str]:
    from gpulayer.lab.fleet import Fleet

    out = Report("objects")
    ray, no_ray = import_ray()
    out(f"# objects.py  {dt.datetime.now().isoformat(timespec='seconds')}  host {socket.gethostname()}  "
        f"cpus {os.cpu_count()}  load {_load()}")
    out(f"# {_versions(ray)}")
    out(f"# size {_gb(args.size)}, {args.jobs} broadcast jobs, {args.shards} shards of {_gb(args.shard_size)} in + "
        f"out ({args.window} in flight), {args.workers} workers x {args.slots} slots (Ray num_cpus "
        f"{args.workers * args.slots}), rounds {args.rounds} (+1 warm-up at small sizes)")
    if ray is None:
        out(f"# Ray side skipped: {no_ray}; to run it: {RAY_PIP}")
    workdir = Path(tempfile.mkdtemp(prefix="gl-objects-", dir=args.workdir))
    store = args.store or str(workdir / "objects")
    sides: list = []
    try:
        if not store.startswith("s3://"):
            Path(store).mkdir(parents=True, exist_ok=True)
            disk_check(Path(store), args, out)
        ceiling_dir = Path(store) if not store.startswith("s3://") else workdir
        writes, reads, loops = [], [], []
        for _ in range(args.rounds):
            w, r = disk_rates(ceiling_dir, args.size)
            writes.append(w)
            reads.append(r)
            loops.append(loopback_seconds(args.size))
        write_bps, read_bps = args.size / statistics.median(writes), args.size / statistics.median(reads)
        loop_bps = args.size / statistics.median(loops)
        out(f"# ceiling, medians of {args.rounds}: disk write {write_bps / 1e9:.2f} GB/s, disk read "
            f"{read_bps / 1e9:.2f} GB/s ({_gb(args.size)} in {ceiling_dir}), loopback TCP {loop_bps / 1e9:.2f} GB/s")
        out.result("ceiling", disk_write_gb_s=write_bps / 1e9, disk_read_gb_s=read_bps / 1e9,
                   loopback_gb_s=loop_bps / 1e9)

        os.environ["GPULAYER_OBJECT_STORE"] = store  # the workers inherit it
        with Fleet(workdir / "fleet", appendonly=False) as fleet:
            if "gpulayer" in args.sides:
                names = [f"objects-{i + 1}" for i in range(args.workers)]
                for name in names:
                    fleet.add_worker(name, slots=args.slots, wait=False, tie_to_parent=True,
                                     extra_args=["--loglevel", "WARNING"])
                fleet.wait_workers(names, timeout=WORKER_READY_TIMEOUT)
                fleet.connect()
                out(f"# gpulayer: Redis on port {fleet.port}, workers {', '.join(names)}, object store {store}")
                sides.append(GpulayerSide(fleet))
            if ray is not None and "ray" in args.sides:
                sides.append(RaySide(ray, args.workers * args.slots, workdir / "ray",
                                     max(2 * GIB, 3 * args.size + 2 * args.window * args.shard_size)))
            rows = {(s.name, c): [] for s in sides for c in CASES}
            for side in sides:  # warm-up: imports, connections, function caches on every worker process
                for case in CASES:
                    run_case(side, case, args, small=True)
                if isinstance(side, GpulayerSide):
                    side.memory = {c: [] for c in CASES}
            out()
            out(f"{'round':>5}  {'case':<10} {'side':<9} {'wall s':>8} {'GB/s':>7}")
            for r in range(args.rounds):
                order = sides[r % len(sides):] + sides[: r % len(sides)]
                for case in CASES:
                    for side in order:
                        elapsed = run_case(side, case, args)
                        rows[side.name, case].append(elapsed)
                        out(f"{r + 1:>5}  {case:<10} {side.name:<9} {elapsed:>8.2f} "
                            f"{moved(case, args) / elapsed / 1e9:>7.2f}")
            gl_memory = next((side.memory for side in sides if isinstance(side, GpulayerSide)), None)
            for side in sides:
                side.close()
            sides = []
    finally:
        for side in sides:
            side.close()
        shutil.rmtree(workdir, ignore_errors=True)

    out()
    out(f"medians over {args.rounds} rounds (load {_load()}); GB/s = bytes delivered / wall time; ceiling = the "
        "raw disk's time for the same writes and reads:")
    out(f"  {'case':<10} {'bytes':>9} {'gpulayer s':>11} {'GB/s':>6} {'ray s':>7} {'GB/s':>6} {'ceiling s':>10} "
        f"{'GB/s':>6} {'gl/ceiling':>11} {'gl/ray':>7}  redis used_memory before/peak/after (MB)")
    for case in CASES:
        gl = statistics.median(rows["gpulayer", case]) if ("gpulayer", case) in rows else None
        ry = statistics.median(rows["ray", case]) if ("ray", case) in rows else None
        ceil = ceiling_seconds(case, args, write_bps, read_bps)
        b = moved(case, args)
        gl_cols = f"{gl:>11.2f} {b / gl / 1e9:>6.2f}" if gl else f"{'-':>11} {'-':>6}"
        ray_cols = f"{ry:>7.2f} {b / ry / 1e9:>6.2f}" if ry else f"{'-':>7} {'-':>6}"
        ratios = (f"{ceil / gl:>11.2f} " + (f"{ry / gl:>7.2f}" if ry else f"{'-':>7}")) if gl else f"{'-':>11} {'-':>7}"
        memory = None
        if gl_memory is not None:
            memory = dict(zip(("before", "peak", "after"),
                              (statistics.median(x[i] for x in gl_memory[case]) / 1e6 for i in range(3))))
        out(f"  {case:<10} {_gb(b):>9} {gl_cols} {ray_cols} {ceil:>10.2f} {b / ceil / 1e9:>6.2f} {ratios}  "
            + (" / ".join(f"{v:.1f}" for v in memory.values()) if memory else "-"))
        out.result(case, bytes=b, gpulayer_s=gl, ray_s=ry, ceiling_s=ceil,
                   gpulayer_gb_s=b / gl / 1e9 if gl else None, ray_gb_s=b / ry / 1e9 if ry else None,
                   to_ceiling=ceil / gl if gl else None, to_ray=ry / gl if gl and ry else None,
                   redis_used_mb=memory)
    out()
    out("goals (issue 42): gl/ceiling >= 0.5 for broadcast and result (within 2x of the ceiling); gl/ray >= 1 for "
        "shards; Redis peak - before under 5 MB")
    return out.lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=_size, default=_size("1GB"), help="the broadcast tensor and the result (1GB)")
    p.add_argument("--jobs", type=int, default=8, help="jobs reading the broadcast ref (8)")
    p.add_argument("--shards", type=int, default=2000, help="shard jobs per round (2000)")
    p.add_argument("--shard-size", type=_size, default=_size("50MB"), help="each shard's input and output (50MB)")
    p.add_argument("--window", type=int, default=8, help="shard jobs in flight (8): the disk holds this many "
                   "inputs and outputs at most")
    p.add_argument("--workers", type=int, default=2, help="gpulayer workers (2)")
    p.add_argument("--slots", type=int, default=1, help="slots per worker (1); Ray gets workers x slots CPUs")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds; medians are quoted (3)")
    p.add_argument("--store", help="the object store: a directory or s3://bucket/prefix (default: a directory "
                   "in the run's temporary folder)")
    p.add_argument("--workdir", help="where the run's temporary folder goes (default TMPDIR)")
    p.add_argument("--sides", type=lambda t: set(t.split(",")), default={"gpulayer", "ray"},
                   help="which sides run besides the ceiling: gpulayer,ray (default both)")
    p.add_argument("--output", default="objects.txt", help="results file under benchmarks/results/<date>-<host>/")
    args = p.parse_args(argv)
    if min(args.jobs, args.shards, args.window, args.workers, args.slots, args.rounds) < 1:
        p.error("--jobs, --shards, --window, --workers, --slots and --rounds must be at least 1")
    unwind_on_signals()
    lines = benchmark(args)
    print(f"\nwritten to {write_results(lines, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
