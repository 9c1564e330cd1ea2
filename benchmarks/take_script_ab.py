"""Redis's CPU per job of the worker's take script (``store/lua/take.lua``): a git revision's against this tree's.

    python benchmarks/take_script_ab.py [--base main] [--jobs 5000] [--rounds 7] [--want 4]

One Redis (no persistence, a free loopback port). Each round pushes ``--jobs`` kombu messages of one user with
no fair-share policy onto ``gl.q.cpu`` and takes them ``--want`` at a time, each take carrying the acks of the
previous one's, as a worker's channel does; the revision's script (as that revision calls it) and this tree's
(with the fair-share keys it is given) alternate. Redis's own time in the scripts (``INFO commandstats``) is
divided by the jobs: the client's round trips, which a shared machine makes noisy, are left out.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import Report, write_results  # same folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from gpulayer.local.redis_server import find_redis_server  # noqa: E402
from gpulayer.store import keys  # noqa: E402

QUEUES = ["gl.q.w.x", "gl.q.cpu", "gl.q.cpu\x06\x163", "gl.q.cpu\x06\x166", "gl.q.cpu\x06\x169"]
BASE = ["unacked", "unacked_index", "gl:inflight:x:1"]


def message(i: int) -> str:
    return json.dumps({"body": "eA==", "headers": {"id": f"j{i}", "gl_client": "me@host"},
                       "properties": {"delivery_info": {"exchange": "", "routing_key": "gl.q.cpu"},
                                      "delivery_tag": f"t{i}"}})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="main", help="the git revision to compare with (default main)")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--want", type=int, default=4, help="messages per take (default 4)")
    p.add_argument("--output", default="take_script_ab.txt")
    args = p.parse_args()
    old_text = subprocess.run(["git", "show", f"{args.base}:gpulayer/store/lua/take.lua"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
    new_text = (ROOT / "gpulayer/store/lua/take.lua").read_text()
    old_fair = "ARGV[4] the usage half-life" in old_text  # (a revision with fair share: called as this tree's)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    out = Report("take_script_ab")
    try:
        r = redis.Redis(port=port)
        deadline = time.time() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        scripts = {"base": (r.register_script(old_text), old_fair), "tree": (r.register_script(new_text), True)}

        def run(which: str) -> float:
            script, fair = scripts[which]
            r.flushall()
            r.lpush("gl.q.cpu", *[message(i) for i in range(args.jobs)])
            r.config_resetstat()
            acks: list[str] = []
            while True:
                if fair:
                    got = script(keys=[*QUEUES, *BASE, *keys.FAIR_KEYS], args=[args.want, time.time(), 0, 86400.0,
                                                                             *acks])
                else:
                    got = script(keys=[*QUEUES, *BASE], args=[args.want, time.time(), 0, *acks])
                if not got:
                    break
                acks = [json.loads(m)["properties"]["delivery_tag"] for m in got[1::2]]
            stats = r.info("commandstats")
            return sum(v["usec"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")) / args.jobs

        rounds: dict[str, list[float]] = {"base": [], "tree": []}
        for _ in range(args.rounds):
            for which in rounds:
                rounds[which].append(run(which))
        out(f"# take.lua, {args.jobs} jobs of one user, no policy, {args.want} per take with the previous acks")
        for which, xs in rounds.items():
            name = args.base if which == "base" else "this tree"
            out(f"{name}: median {statistics.median(xs):.2f} us of Redis CPU per job; rounds "
                + " ".join(f"{x:.2f}" for x in xs))
            out.result(which, us_per_job=statistics.median(xs))
        out(f"this tree / {args.base}: {statistics.median(rounds['tree']) / statistics.median(rounds['base']):.3f}")
    finally:
        server.terminate()
        server.wait(10)
    print(f"\nwritten to {write_results(out.lines, args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
