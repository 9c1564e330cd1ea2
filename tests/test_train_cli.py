"""`gpulayer train` end to end: a real script, real workers, live output, the job's exit status."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpulayer.deadline import wait_until
from gpulayer.cli.train import package_workdir
from gpulayer.workspace import cache as code_cache

SCRIPT = textwrap.dedent("""
    import argparse, sys
    import torch, torch.distributed as dist
    from helper import double   # a module from the packaged working directory

    p = argparse.ArgumentParser()
    p.add_argument("--value", type=float)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--exit-code", type=int, default=0)
    a = p.parse_args()
    dist.init_process_group("gloo")
    t = torch.tensor([double(a.value) * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"total {t.item():.1f} from rank {dist.get_rank()}", flush=True)
    if dist.get_rank() == a.fail_rank:
        if a.exit_code:
            sys.exit(a.exit_code)
        raise RuntimeError("diverged at step 3")
    dist.barrier()
""")


@pytest.fixture
def project(tmp_path):
    d = tmp_path / "proj"
    (d / ".git").mkdir(parents=True)
    (d / ".git" / "big").write_bytes(b"x" * 1000)
    (d / "train.py").write_text(SCRIPT)
    (d / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    return d


def run_train(fleet, project, *args):
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)
    return subprocess.run([sys.executable, "-m", "gpulayer", "train", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=240)


def test_train_runs_a_script_and_streams_every_rank(fleet, project):
    out = run_train(fleet, project, "--nodes", "2", "--procs-per-node", "1", "train.py", "--value", "1.5")
    assert out.returncode == 0, out.stderr
    # 2 * 1.5 * (1 + 2) = 9.0 on both ranks, each line prefixed with its rank.
    assert "[rank 0] total 9.0 from rank 0" in out.stdout
    assert "[rank 1] total 9.0 from rank 1" in out.stdout
    assert "placed on 2 workers" in out.stderr


def test_train_exit_status_follows_the_job(fleet, project):
    out = run_train(fleet, project, "--nodes", "2", "--procs-per-node", "1", "train.py", "--value", "1",
                    "--fail-rank", "1")
    assert out.returncode == 1
    assert "rank 1" in out.stderr and "diverged at step 3" in out.stderr
    out = run_train(fleet, project, "--nodes", "1", "--procs-per-node", "2", "train.py", "--value", "1",
                    "--fail-rank", "0", "--exit-code", "3")
    assert out.returncode == 3, out.stderr


def test_train_refuses_a_missing_script(fleet, project):
    out = run_train(fleet, project, "--nodes", "1", "--procs-per-node", "1", "nope.py")
    assert out.returncode == 2 and "script nope.py not found" in out.stderr


def test_packaging_leaves_out_git_and_large_files(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "objects").write_bytes(b"x" * 100)
    (tmp_path / "data.bin").write_bytes(os.urandom(2048))
    (tmp_path / "train.py").write_text("print(1)\n")
    archive, left_out = package_workdir(tmp_path, max_file=1024)
    import io
    import tarfile

    names = tarfile.open(fileobj=io.BytesIO(archive)).getnames()
    assert names == [".gpulayer-code.json", "train.py"] and left_out == ["data.bin (0.0 MiB)"]
    from gpulayer.errors import ConfigError

    (tmp_path / "more.bin").write_bytes(os.urandom(900))
    with pytest.raises(ConfigError, match="too large to ship"):
        package_workdir(tmp_path, max_bytes=500, max_file=1024)


# -- the working directory: torchrun's contract ---------------------------------------------------

RESUME = textwrap.dedent("""
    import os
    import torch, torch.distributed as dist
    from helper import double   # leaves a __pycache__ in the working directory, which must not come back

    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), os.environ["TORCHELASTIC_RESTART_COUNT"]
    assert os.getcwd() == os.path.realpath(os.environ["GPULAYER_WORKDIR"]), os.getcwd()
    if attempt == "0":
        open(f"hello-a0-r{rank}", "w").write("attempt 0")   # every rank, in its node's shared directory
        if os.environ["LOCAL_RANK"] == "0":
            torch.save({"step": 5}, "snapshot.pt")
        dist.barrier()
        if rank == 3:
            raise RuntimeError("failing on purpose after the snapshot")
        dist.barrier()   # the others wait here until the agent stops them
    state = torch.load("snapshot.pt")   # attempt 1: the snapshot of attempt 0 is in the working directory
    t = torch.tensor([float(state["step"])])
    dist.all_reduce(t)
    if rank == 0:
        seen = sorted(f for f in os.listdir(".") if f.startswith("hello-"))
        open("result.txt", "w").write(f"resumed from step {state['step']} in attempt {attempt}; "
                                      f"sum {t.item():.0f}; saw {' '.join(seen)}")
        print(f"resumed from step {state['step']}", flush=True)
    dist.barrier()
""")

FAILS = textwrap.dedent("""
    import os
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        torch.save({"step": 7}, "snapshot.pt")
        open("partial.txt", "w").write("written before the failure")
        open("helper.py", "a").write("# changed by rank 0\\n")
    dist.barrier()
    if dist.get_rank() == 2:
        raise RuntimeError("diverged at step 7")
    dist.barrier()
""")


def worker_tmp(fleet) -> dict[str, set[str]]:
    """What is in every worker's temp root now."""
    return {name: set(os.listdir(fleet.worker_tmp(name))) for name in fleet.workers}


def assert_nothing_left(fleet, before: dict[str, set[str]]):
    def new():
        return {name: sorted(names - before.get(name, set())) for name, names in worker_tmp(fleet).items()
                if names - before.get(name, set())}

    wait_until(lambda: not new(), what="every worker's temp root to be as before the job")
    # The cluster's root there goes with its last directory, at the next sweep (workdir.py), unless the
    # machine's cache of shipped code keeps it (workspace/cache.py: an unpacked archive stays a day after the
    # last job that used it, on purpose; other tests' jobs on this session fleet fill it under pytest-xdist,
    # whose `python -c` process ships its working directory): then that cache is all the root holds.
    wait_until(lambda: not cluster_roots_left(fleet), what="the cluster's root in every worker's temp root to go")


def cluster_roots_left(fleet) -> list[str]:
    """What is in the workers' cluster roots besides the shipped-code cache (a root of nothing else: nothing)."""
    left = []
    for name in fleet.workers:
        tmp = fleet.worker_tmp(name)
        for root in (n for n in os.listdir(tmp) if n.startswith("gpulayer-")):
            try:
                inside = set(os.listdir(os.path.join(tmp, root)))
            except FileNotFoundError:
                continue  # gone meanwhile
            left += [f"{name}: {root}/{n}" for n in sorted(inside - {code_cache.CODE_DIR})] or \
                ([] if inside else [f"{name}: {root}"])
    return left


def test_train_resumes_from_its_snapshot_after_a_restart(fleet, project):
    (project / "resume.py").write_text(RESUME)
    before = worker_tmp(fleet)
    out = run_train(fleet, project, "--nodes", "2", "--procs-per-node", "2", "--max-restarts", "1", "resume.py")
    assert out.returncode == 0, out.stderr
    assert "[rank 0] resumed from step 5" in out.stdout
    result = (project / "result.txt").read_text()
    # Attempt 1 found attempt 0's snapshot (sum over 4 ranks of step 5), and both ranks of node 0 had
    # written into the one directory they share.
    assert result.startswith("resumed from step 5 in attempt 1; sum 20; saw "), result
    assert result.split("saw ")[1] in ("hello-a0-r0 hello-a0-r1", "hello-a0-r2 hello-a0-r3"), result
    assert (project / "snapshot.pt").is_file()
    assert "came back from node 0" in out.stderr and "result.txt" in out.stderr
    assert not (project / "__pycache__").exists()  # caches the ranks made stay behind
    assert_nothing_left(fleet, before)


def test_a_failed_job_brings_its_files_back_and_leaves_nothing_behind(fleet, project):
    (project / "fails.py").write_text(FAILS)
    before = worker_tmp(fleet)
    out = run_train(fleet, project, "--nodes", "2", "--procs-per-node", "2", "fails.py")
    assert out.returncode == 1, out.stderr
    assert "rank 2" in out.stderr and "diverged at step 7" in out.stderr
    assert (project / "partial.txt").read_text() == "written before the failure"
    assert (project / "helper.py").read_text().endswith("# changed by rank 0\n")  # changed files come back
    import torch

    assert torch.load(project / "snapshot.pt") == {"step": 7}
    assert_nothing_left(fleet, before)

    # --no-pull: the job's files stay behind (and are removed with its directories).
    for name in ("partial.txt", "snapshot.pt"):
        (project / name).unlink()
    out = run_train(fleet, project, "--nodes", "2", "--procs-per-node", "2", "--no-pull", "fails.py")
    assert out.returncode == 1, out.stderr
    assert not (project / "partial.txt").exists() and "came back" not in out.stderr
    assert_nothing_left(fleet, before)


def test_keep_workdir_leaves_the_directory_and_says_where(fleet, project):
    before = worker_tmp(fleet)
    out = run_train(fleet, project, "--nodes", "1", "--procs-per-node", "1", "--keep-workdir", "train.py",
                    "--value", "1")
    assert out.returncode == 0, out.stderr
    kept = [line.rsplit(": ", 1)[1] for line in out.stderr.splitlines() if "kept node 0's working directory" in line]
    assert len(kept) == 1, out.stderr
    try:
        assert (Path(kept[0]) / "train.py").read_text() == SCRIPT and (Path(kept[0]) / "helper.py").is_file()
    finally:
        shutil.rmtree(Path(kept[0]).parent)
    assert_nothing_left(fleet, before)


def test_torchrun_ranks_share_the_directory_and_leave_nothing_behind(fleet, project):
    (project / "where.py").write_text(textwrap.dedent("""
        import os
        import torch.distributed as dist
        dist.init_process_group("gloo")
        open(f"r{dist.get_rank()}", "w").write(os.getcwd())
        dist.barrier()
        if dist.get_rank() == 0:
            print("shared:", sorted(f for f in os.listdir(".") if f in ("r0", "r1")), flush=True)
    """))
    before = worker_tmp(fleet)
    out = run_train(fleet, project, "--nodes", "1", "--procs-per-node", "2", "--launcher", "torchrun", "where.py")
    assert out.returncode == 0, out.stderr
    assert "shared: ['r0', 'r1']" in out.stdout
    assert (project / "r0").read_text() == (project / "r1").read_text()  # one directory for the node's ranks
    assert_nothing_left(fleet, before)  # torchrun's own logs (torchelastic_*) included


def test_a_stopping_worker_removes_its_directories_and_a_starting_one_sweeps_stale_ones(fresh_fleet, project):
    from gpulayer import JobRejected, distributed
    from gpulayer.gang import workdir
    from gpulayer.cli.train import run_script

    from gpulayer.store.cluster import cluster_id

    tmp = fresh_fleet.worker_tmp("w-solo")
    tmp.mkdir(parents=True)
    client = fresh_fleet.client()
    root = workdir.root(cluster_id(client), tmp)  # made now, before any worker: the one the worker reads
    client.close()
    stale = workdir.base_for(root, "0" * 32, "w-solo")  # of a gang Redis never heard of
    not_mine = workdir.base_for(root, "0" * 32, "w-other")  # another worker's, sharing the temp root
    other_cluster = workdir.base_for(workdir.root("0ther", tmp), "0" * 32, "w-solo")  # same name, other cluster
    for d in (stale, not_mine, other_cluster):
        (workdir.make(d) / "work").mkdir()
    fresh_fleet.add_worker("w-solo", slots=2)
    wait_until(lambda: not stale.exists(), what="the agent's start-up sweep")
    assert not_mine.exists() and other_cluster.exists()

    fresh_fleet.connect()
    (project / "sleep.py").write_text("import time\nopen('started', 'w').close()\ntime.sleep(600)\n")
    # One restart left: only the worker's stop says the directory will not be used again.
    job = distributed(run_script, "sleep.py", [], nodes=1, procs_per_node=2, max_restarts=1,
                      workdir=workdir.ShippedDir(package_workdir(project)[0]))
    base = workdir.base_for(root, job.id, "w-solo")
    wait_until(lambda: (base / "work" / "started").exists(), timeout=120, what="the ranks to start")
    fresh_fleet.stop_worker("w-solo")  # SIGTERM: a graceful stop
    assert not base.exists()
    with pytest.raises(JobRejected, match="no live worker"):  # the restart finds no worker
        job.get(timeout=60)


# -- a script written for Lightning itself, unchanged -------------------------------------------

LIGHTNING_SCRIPT = textwrap.dedent("""
    import os
    import torch, torch.distributed as dist
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Reporting(BoringModel):
        def on_fit_start(self):
            t = self.trainer
            print(f"world {t.world_size} rank {t.global_rank} node {t.node_rank} local {t.local_rank} "
                  f"of nodes {t.num_nodes} (RANK {os.environ['RANK']} GROUP_RANK {os.environ['GROUP_RANK']})",
                  flush=True)

    L.seed_everything(3)
    model = Reporting()
    trainer = L.Trainer(num_nodes=2, devices=2, strategy="ddp", accelerator="cpu", max_epochs=1,
                        limit_train_batches=4, limit_val_batches=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    # DDP keeps the replicas identical: every rank ends with the same weights.
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if trainer.global_rank == 0:
        same = all(torch.equal(mine, other) for other in every)
        print(f"weights identical on {len(every)} ranks: {same}; steps {trainer.global_step}", flush=True)
""")


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None and not os.environ.get("CI"),
                    reason="lightning is not installed (the test extras install it; required under CI)")
def test_a_script_written_for_lightning_runs_unchanged_on_two_machines_of_two(fleet, project):
    """Lightning finds torchrun's environment in every rank: world size 4, node ranks from GROUP_RANK."""
    (project / "lit.py").write_text(LIGHTNING_SCRIPT)
    out = run_train(fleet, project, "--nodes", "2", "--procs-per-node", "2", "lit.py")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for rank in range(4):
        node, local = divmod(rank, 2)
        assert (f"[rank {rank}] world 4 rank {rank} node {node} local {local} of nodes 2 "
                f"(RANK {rank} GROUP_RANK {node})") in out.stdout, out.stdout
    # limit_train_batches=4 of each rank's shard (16 of the 64 rows): 4 optimizer steps, in step on every rank.
    assert "[rank 0] weights identical on 4 ranks: True; steps 4" in out.stdout, out.stdout


# --- flags, and why a job waits (issue 31, command line) ---------------------------------------------

def test_train_refuses_a_bad_flag_in_one_line_naming_it(fleet, project):
    for args, said in ((["--nodes", "0", "--procs-per-node", "1"], "--nodes 0: must be greater than or equal to 1"),
                       (["--nodes", "1", "--procs-per-node", "513"], "--procs-per-node 513: must be less than or "
                                                                      "equal to 512"),
                       (["--nodes", "1", "--procs-per-node", "1", "--max-restarts", "-1"], "--max-restarts -1"),
                       (["--nodes", "1", "--procs-per-node", "1", "--timeout", "0"], "--timeout 0.0: must be "
                                                                                      "greater than 0"),
                       (["--nodes", "1", "--procs-per-node", "1", "--priority", "10"], "--priority 10: must be less "
                                                                                        "than or equal to 9")):
        out = run_train(fleet, project, *args, "train.py")
        assert out.returncode == 2, out.stderr
        assert out.stderr.splitlines() == [f"gpulayer train: error: {said}"
                                           + out.stderr.split(said, 1)[1].rstrip("\n")], out.stderr
        assert "Traceback" not in out.stderr and "pydantic" not in out.stderr


def test_train_help_documents_every_flag(fleet, project):
    from gpulayer.cli import build_parser

    out = run_train(fleet, project, "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for flag, words in (("--nodes N", "workers (machines) the job runs on"),
                        ("--procs-per-node M", "processes (ranks) on each node"),
                        ("--launcher {direct,torchrun}", "direct: each worker starts its ranks itself"),
                        ("--zone ZONE", "run only on workers in this zone"),
                        ("--max-restarts K", "start the whole job again"),
                        ("--priority P", "0 (the lowest, default) to 9; higher wins"),
                        ("--timeout SECONDS", "give up when the job has waited this long")):
        assert f"{flag} {words}" in text, (flag, text)
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    undocumented = [a.option_strings or a.dest for a in train._actions if not a.help]
    assert not undocumented, undocumented


HOLD = "test:train-waits:release"


def hold_until_released(key):
    import gpulayer as _gl

    assert _gl.app.redis_client().blpop([key], 120), f"never released: {key}"


def _whole_fleet_held(fleet):
    """A 2 x 2 job on w-a and w-b (the only workers with 2 slots), holding them until the test pushes to ``HOLD``."""
    from gpulayer import distributed

    fleet.client().delete(HOLD)
    job = distributed(hold_until_released, HOLD, nodes=2, procs_per_node=2)
    job.placement  # noqa: B018
    return job


def test_train_on_a_pipe_says_why_its_job_waits(fleet, project):
    (project / "quick.py").write_text("print('ran', flush=True)\n")
    hold = _whole_fleet_held(fleet)
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer", "train", "--nodes", "2", "--procs-per-node", "2",
                             "quick.py"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stderr.readline()  # the first thing it says: it waits, and why
        assert " 2 x 2 waits: waiting for 2 workers with 2 free slots" in line and "(#1 in line)" in line, line
        fleet.client().rpush(HOLD, *["go"] * 4)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "placed on 2 workers" in err and "[rank 0] ran" in out
        hold.get(timeout=60)
    finally:
        fleet.client().rpush(HOLD, *["go"] * 4)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        fleet.client().delete(HOLD)


def test_train_at_a_terminal_shows_why_its_job_waits_in_its_bar(fleet, project):
    from .terminal import Terminal

    (project / "quick.py").write_text("print('ran', flush=True)\n")
    hold = _whole_fleet_held(fleet)
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret, TERM="xterm")
    term = Terminal([sys.executable, "-m", "gpulayer", "train", "--nodes", "2", "--procs-per-node", "2", "quick.py"],
                    project, env, columns=200)
    try:
        wait_until(lambda: "waiting: waiting for 2 workers with 2 free slots" in term.plain(), 60,
                   f"the bar to say why the job waits ({term.plain()[-1500:]!r})")
        fleet.client().rpush(HOLD, *["go"] * 4)
        assert term.proc.wait(120) == 0, term.plain()
        term._reader.join(5)
        assert "[rank 0] ran" in term.plain() and "waits:" not in term.plain()  # the bar, not a line, at a terminal
        hold.get(timeout=60)
    finally:
        fleet.client().rpush(HOLD, *["go"] * 4)
        term.close()
        fleet.client().delete(HOLD)


def test_train_whose_reader_goes_away_stops_quietly_and_cancels_its_job(fleet, project):
    """`gpulayer train ... | head -1`: the command ends as Ctrl-C ends it, without a traceback."""
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore

    (project / "chatty.py").write_text("import time\nprint('hello', flush=True)\ntime.sleep(120)\n")
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run([sys.executable, "-m", "gpulayer", "train", "--nodes", "1", "--procs-per-node", "1",
                              "chatty.py"], cwd=project, env=env, stdout=write, stderr=subprocess.PIPE, text=True,
                             timeout=120)
    finally:
        os.close(write)
    assert out.returncode == 141, out.stderr
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr
    assert "the reader of its output went away; stopping as Ctrl-C would" in out.stderr, out.stderr
    job_id = out.stderr.split("gpulayer train: ", 1)[1].split()[0]
    assert GangStore(redis_client()).record(job_id)["state"] == "cancelled"


def test_train_without_nodes_or_procs_per_node_runs_one_rank_as_torchrun_would(fleet, project):
    out = run_train(fleet, project, "train.py", "--value", "2")
    assert out.returncode == 0, out.stderr
    assert "[rank 0] total 4.0 from rank 0" in out.stdout, out.stdout
    assert "[rank 1]" not in out.stdout


def test_train_says_what_to_change_in_flags_not_python_keywords(fleet, project):
    # The session fleet: 3 workers, 2 of them with 2 slots, no GPU.
    for args, flags in ((["--nodes", "4"], ("lower --nodes or --procs-per-node",)),
                        (["--nodes", "2", "--procs-per-node", "3"], ("lower --nodes or --procs-per-node",)),
                        (["--cuda"], ("drop --cuda",))):
        out = run_train(fleet, project, *args, "train.py")
        assert out.returncode != 0, out.stdout
        assert all(f in out.stderr for f in flags), out.stderr
        assert "nodes=" not in out.stderr and "procs_per_node" not in out.stderr and "cuda=True" not in out.stderr, \
            out.stderr
        assert "Traceback" not in out.stderr, out.stderr
