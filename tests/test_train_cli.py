"""`gpulayer train` end to end: a real script, real workers, live output, the job's exit status."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gpulayer.train import package_workdir

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
    assert names == ["train.py"] and left_out == ["data.bin (0 MiB)"]
    from gpulayer.errors import ConfigError

    (tmp_path / "more.bin").write_bytes(os.urandom(900))
    with pytest.raises(ConfigError, match="packs to over"):
        package_workdir(tmp_path, max_bytes=500, max_file=1024)
