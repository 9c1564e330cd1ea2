"""Start a fleet of workers on "separate machines" (network namespaces) and keep it up until Ctrl-C.

    sudo .venv/bin/python scripts/netns_fleet.py --workers 3 --slots 2

Each worker ``ns-<i>`` runs in its own namespace with its own address; Redis
listens on loopback and on the bridge address. Point a client at the printed
broker URL and secret (``gpulayer.init(URL, secret=SECRET)``).
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

from gpulayer.lab.netns import NetnsLab, NetnsUnavailable
from gpulayer.lab.fleet import Fleet


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="namespaces, one worker each (default 2)")
    p.add_argument("--slots", type=int, default=2, help="slots per worker (default 2)")
    p.add_argument("--workdir", type=Path, default=None, help="Redis data and worker logs (default: a temp dir)")
    a = p.parse_args(argv)
    if a.workers < 1 or a.slots < 1:
        p.error(f"--workers and --slots must be at least 1 (got {a.workers} and {a.slots})")
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="gpulayer-netns-"))
    # Ctrl-C and SIGTERM both end the wait below and run the cleanup (SIGINT too when started with `&`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    lab = NetnsLab(a.workers)
    try:
        lab.start()
    except NetnsUnavailable as err:
        print(f"cannot build the namespaces: {err}", file=sys.stderr)
        return 1
    try:
        fleet = Fleet(workdir, secret=secrets.token_urlsafe(32), password=secrets.token_urlsafe(24),
                      bind=f"127.0.0.1 {lab.host_address}", host=lab.host_address)
        with fleet:
            names = [f"ns-{i}" for i in range(1, a.workers + 1)]
            for i, name in enumerate(names, start=1):
                fleet.add_worker(name, slots=a.slots, zone=f"zone-{chr(ord('a') + (i - 1) % 26)}",
                                 region="region-1", prefix=lab.prefix(i), advertise_addr=lab.address(i), wait=False)
            fleet.wait_workers(names)
            print(f"broker URL : {fleet.url}")
            print(f"secret     : {fleet.secret}")
            print(f"redis      : 127.0.0.1:{fleet.port} and {lab.host_address}:{fleet.port} "
                  f"(bridge {lab.names.bridge})")
            for i, name in enumerate(names, start=1):
                print(f"{name:<11}: {lab.address(i):<15} namespace {lab.namespace(i)}  "
                      f"(shell: sudo {' '.join(lab.prefix(i))} bash)")
            print(f"logs       : {workdir}")
            print("Ctrl-C to stop and delete the namespaces.", flush=True)
            while all(fleet.workers[n].poll() is None for n in names):
                time.sleep(0.5)
            dead = [n for n in names if fleet.workers[n].poll() is not None]
            print(f"worker(s) {', '.join(dead)} exited; see {workdir}; stopping", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        print("stopping", file=sys.stderr)
        return 0
    finally:
        lab.close()


if __name__ == "__main__":
    sys.exit(main())
