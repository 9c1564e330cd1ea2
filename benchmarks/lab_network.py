"""The simulated network's rates: TCP throughput between machines of a shaped lab, per kind of link.

Builds a ``gpulayer.lab.netns`` lab of 2 regions x 2 zones x 2 machines with the default shaping
(in-zone unlimited, 2 Gbit/s across zones, 200 Mbit/s across regions, rate only, no delay), then
for each link kind streams one TCP connection for ``--seconds`` from machine 1 to a peer (in its
zone, in the other zone of its region, in the other region) and to Redis's address (the bridge,
the control plane: unshaped), ``--runs`` times, rotating the order. The receiver counts the bytes;
the rate is bytes over the time from the first to the last byte. Also prints the bytes the
sender's ``tc`` classes counted, so each transfer is seen going through its class.

    python benchmarks/lab_network.py [--seconds 2] [--runs 3] [--cross-zone 2gbit] [--cross-region 200mbit]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import Report, unwind_on_signals, write_results  # same folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpulayer.lab.netns import NetnsLab, Shaping, Topology  # noqa: E402

RECEIVER = r"""
import socket, sys, time
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
n, first, last = 0, None, None
while True:
    b = conn.recv(1 << 20)
    if not b:
        break
    now = time.perf_counter()
    first = first or now
    n += len(b)
    last = now
print(n, (last - first) if first else 0.0, flush=True)
"""
SENDER = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
buf = b"x" * (1 << 20)
end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    c.sendall(buf)
c.close()
"""


def transfer(src_prefix: list[str], dst_prefix: list[str], dst: str, seconds: float) -> float:
    """Mbit/s of one TCP stream from ``src`` to ``dst`` for ``seconds`` (measured at the receiver)."""
    recv = subprocess.Popen([*dst_prefix, sys.executable, "-c", RECEIVER, dst], stdout=subprocess.PIPE, text=True)
    try:
        port = recv.stdout.readline().strip()
        subprocess.run([*src_prefix, sys.executable, "-c", SENDER, dst, port, str(seconds)], check=True,
                       timeout=seconds + 60)
        n, secs = recv.stdout.readline().split()
        recv.wait(30)
        return int(n) * 8 / float(secs) / 1e6
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cross-zone", default=Shaping.cross_zone)
    p.add_argument("--cross-region", default=Shaping.cross_region)
    args = p.parse_args()
    unwind_on_signals()
    line = Report("lab_network")

    shaping = Shaping(args.cross_zone, args.cross_region)
    topo = Topology.parse("2r x 2z x 2m")
    line(f"lab_network.py  {time.strftime('%Y-%m-%d %H:%M:%S')}  python {platform.python_version()}  "
         f"{os.cpu_count()} CPUs  load average {os.getloadavg()[0]:.1f}")
    line(f"topology {topo.describe()}; shaping: {shaping.describe()}; one TCP stream, {args.seconds:g} s, "
         f"{args.runs} runs per link, median")
    with NetnsLab(topo, shaping) as lab:
        m1 = lab.machine(1)
        peers = {"in-zone": lab.machine(2), "cross-zone": lab.machine(3), "cross-region": lab.machine(5)}
        kinds = [*peers, "to-redis"]
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        before = lab.class_bytes(1)
        for r in range(args.runs):
            for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                if kind == "to-redis":
                    rates[kind].append(transfer(lab.prefix(1), [], lab.host_address, args.seconds))
                else:
                    peer = peers[kind]
                    rates[kind].append(transfer(lab.prefix(1), lab.prefix(peer.index), peer.address, args.seconds))
        sent = {k: v - before[k] for k, v in lab.class_bytes(1).items()}
        configured = {"in-zone": "unlimited", "cross-zone": args.cross_zone, "cross-region": args.cross_region,
                      "to-redis": "unlimited (control plane, in-zone class)"}
        line(f"\n{'link':<14}{'configured':>40}{'measured Mbit/s':>18}   runs")
        for kind in kinds:
            med = statistics.median(rates[kind])
            line(f"{kind:<14}{configured[kind]:>40}{med:>18.0f}   {' '.join(f'{x:.0f}' for x in rates[kind])}")
            line.result(kind, configured=configured[kind], mbit_s=med, runs=[round(x, 1) for x in rates[kind]])
        line(f"\nbytes through machine 1's tc classes: {json.dumps(sent)}")
        line(f"load average at the end {os.getloadavg()[0]:.1f}")
    print("wrote", write_results(line.lines, "lab_network.txt"))


if __name__ == "__main__":
    main()
