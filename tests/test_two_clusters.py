"""Two clusters on one host leave each other alone: the same worker names, one temp root, both sweeping.

Two `gpulayer up` in different homes (two users, or a test fleet beside a running cluster) both call their
workers ``local-1`` and ``local-2``. Each worker's local state lives under its own cluster's root
(``<TMPDIR>/gpulayer-<cluster id>/``, gang/workdir.py), so a sweep never reaches the other cluster's.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

from gpulayer import distributed, submit, submit_batch
from gpulayer.cli.train import package_workdir, run_script
from gpulayer.gang import workdir
from gpulayer.store.cluster import cluster_id

from .fleets import running_fleet, wait_until

NAMES = ("local-1", "local-2")

# Holds its node's directory until the test releases it; exits non-zero if a file it was shipped vanishes.
HOLD = """
import os, sys, time
me = open("cluster.txt").read()
open(f"started-{os.environ['RANK']}", "w").close()
deadline = time.monotonic() + 120
while not os.path.exists("release"):
    try:
        if open("cluster.txt").read() != me:
            sys.exit(3)
    except FileNotFoundError:
        sys.exit(4)  # the directory went while the job ran
    if time.monotonic() > deadline:
        sys.exit(5)
    time.sleep(0.05)
"""


def square(x):
    return x * x


def test_two_clusters_with_the_same_worker_names_never_touch_each_others_directories(tmp_path):
    shared_tmp = tmp_path / "tmp"  # one temp root for all four workers, as /tmp is on a shared host
    shared_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(shared_tmp))
    with ExitStack() as stack:
        fleets = {tag: stack.enter_context(running_fleet(tmp_path / tag, password=f"pw-{tag}"))
                  for tag in ("a", "b")}
        for fleet in fleets.values():
            for name in NAMES:
                fleet.add_worker(name, slots=2, torch=False, env=env, wait=False)
        roots = {}
        for tag, fleet in fleets.items():
            fleet.wait_workers(NAMES)
            client = fleet.client()
            roots[tag] = workdir.root(cluster_id(client), shared_tmp)  # what the workers read at their start
            client.close()
        assert roots["a"] != roots["b"]

        jobs, dirs = {}, {}
        for tag, fleet in fleets.items():
            project = tmp_path / f"project-{tag}"
            project.mkdir()
            (project / "hold.py").write_text(HOLD)
            (project / "cluster.txt").write_text(tag)
            fleet.connect()
            jobs[tag] = distributed(run_script, "hold.py", [], nodes=2, procs_per_node=1, max_restarts=1,
                                    timeout=60, workdir=workdir.ShippedDir(package_workdir(project)[0]))
            # Ordinary jobs on the slot each worker has left beside the gang's. They ship no code: under
            # pytest-xdist this process is `python -c`, whose default would ship the working directory, and an
            # unpacked archive stays in the cluster's root for a day on purpose (workspace/cache.py), where
            # this test wants to see only the gangs' directories.
            assert submit_batch([submit.s(square, i) for i in range(20)], working_dir=False).get(timeout=60) == \
                [i * i for i in range(20)]
            dirs[tag] = [workdir.base_for(roots[tag], jobs[tag].id, name) / "work" for name in NAMES]
            wait_until(lambda: all(any(n.startswith("started-") for n in _ls(d)) for d in dirs[tag]), 60,
                       f"cluster {tag}'s ranks to start in their directories")

        # Both clusters' directories exist; now each worker's sweep must run: a directory of a gang its Redis
        # never heard of, planted in its own root, goes at its next sweep (every 2 s), under the same name
        # as the other cluster's worker.
        decoys = [workdir.make(workdir.base_for(roots[tag], "0" * 32, name)) for tag in fleets for name in NAMES]
        wait_until(lambda: not any(d.exists() for d in decoys), 30, "every worker of both clusters to sweep")
        for tag in fleets:
            for d in dirs[tag]:
                assert (d / "cluster.txt").read_text() == tag and (d / "hold.py").is_file(), d
            assert sorted(os.listdir(roots[tag])) == sorted(d.parent.name for d in dirs[tag])
        # Connected to b: its jobs still run (no code shipped, as above).
        assert submit.s(square, 7).apply_async(working_dir=False).get(timeout=60) == 49

        for tag, fleet in fleets.items():
            for d in dirs[tag]:
                (d / "release").touch()
        for tag, fleet in fleets.items():
            fleet.connect()
            assert jobs[tag].get(timeout=60) == [0, 0]
            assert jobs[tag].attempt == 0  # no rank failed, so nothing restarted
        # Each cluster's own agents remove its directories, then its root. (What else is there, multiprocessing's
        # pymp-* directories, has a random name of its own.)
        wait_until(lambda: not any(r.exists() for r in roots.values()), 30, "both clusters' roots to go")
        assert not [n for n in os.listdir(shared_tmp) if n.startswith("gpulayer-")]


def _ls(path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
