"""A restart resumes on every node: ``gpulayer train --max-restarts 1`` with a rank on node 1 SIGKILLed.

The script is our own, in the shape of pytorch/examples' ddp-tutorial-series ``multinode.py``: global
rank 0 saves a snapshot in its working directory each epoch, every rank loads it when present and resumes
from its epoch. Under torchrun it needs a shared file system; here node 0's files reach node 1 through
the cluster (``--restart-from node0``, the default), so every rank resumes from the same epoch.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from gpulayer.cli.train import package_workdir, run_script
from tests.test_train_cli import assert_nothing_left, run_train, worker_tmp

MULTINODE = textwrap.dedent("""
    import argparse, json, os, signal
    import torch, torch.distributed as dist

    SNAPSHOT = "snapshot.json"

    class Trainer:
        def __init__(self, save_every):
            self.global_rank = int(os.environ["RANK"])
            self.attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
            self.save_every = save_every
            self.epochs_run = 0
            if os.path.exists(SNAPSHOT):
                with open(SNAPSHOT) as f:
                    self.epochs_run = json.load(f)["EPOCHS_RUN"]
                print(f"attempt {self.attempt}: Resuming training from snapshot at Epoch {self.epochs_run}",
                      flush=True)

        def _run_epoch(self, epoch):
            step = torch.ones(1)
            dist.all_reduce(step)  # a training step: it waits for every rank, as DDP's gradient sync does

        def _save_snapshot(self, epoch):
            with open(SNAPSHOT + ".tmp", "w") as f:
                json.dump({"EPOCHS_RUN": epoch}, f)
            os.replace(SNAPSHOT + ".tmp", SNAPSHOT)

        def train(self, max_epochs, kill_rank, kill_epoch):
            for epoch in range(self.epochs_run, max_epochs):
                self._run_epoch(epoch)
                if self.global_rank == 0 and epoch % self.save_every == 0:
                    self._save_snapshot(epoch)
                dist.barrier()
                if (self.attempt, self.global_rank, epoch) == (0, kill_rank, kill_epoch):
                    os.kill(os.getpid(), signal.SIGKILL)  # a rank on node 1 dies mid-run

    p = argparse.ArgumentParser()
    p.add_argument("total_epochs", type=int)
    p.add_argument("save_every", type=int)
    p.add_argument("--kill-rank", type=int, default=2)
    p.add_argument("--kill-epoch", type=int, default=2)
    a = p.parse_args()
    dist.init_process_group("gloo")
    trainer = Trainer(a.save_every)
    trainer.train(a.total_epochs, a.kill_rank, a.kill_epoch)
    started = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(started, torch.tensor([trainer.epochs_run]))
    if trainer.global_rank == 0:
        print(f"attempt {trainer.attempt}: ranks started at epochs {[int(t) for t in started]}", flush=True)
    dist.destroy_process_group()
""")


@pytest.fixture
def multinode(tmp_path):
    d = tmp_path / "proj"
    d.mkdir()
    (d / "multinode.py").write_text(MULTINODE)
    return d


def test_a_restart_resumes_every_rank_from_rank_0s_snapshot(fleet, multinode):
    before = worker_tmp(fleet)
    out = run_train(fleet, multinode, "--nodes", "2", "--procs-per-node", "2", "--max-restarts", "1",
                    "multinode.py", "5", "1", "--kill-rank", "2", "--kill-epoch", "2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # Every rank, on both nodes, found rank 0's snapshot of epoch 2 and resumed there.
    for rank in range(4):
        assert f"[rank {rank}] attempt 1: Resuming training from snapshot at Epoch 2" in out.stdout, out.stdout
    assert "[rank 0] attempt 1: ranks started at epochs [2, 2, 2, 2]" in out.stdout, out.stdout
    assert "attempt 0: Resuming" not in out.stdout
    # The restart is announced, with its cause and where the nodes started.
    announced = [line for line in out.stderr.splitlines() if "restarting 2 x 2" in line]
    assert len(announced) == 1, out.stderr
    assert re.fullmatch(r"gpulayer train: attempt 1 failed \(rank 2 on w-[ab]: killed by SIGKILL\); restarting "
                        r"2 x 2 \(attempt 2 of 2\), every node from node 0's files \(1 file, 17 bytes, from w-[ab]\)",
                        announced[0]), announced[0]
    # The last snapshot came back to the client, and nothing is left on the workers.
    assert json.loads((multinode / "snapshot.json").read_text()) == {"EPOCHS_RUN": 4}
    assert_nothing_left(fleet, before)


def test_fresh_restarts_every_node_from_the_shipped_copy_and_status_tells_the_restart(fleet, multinode):
    from gpulayer import distributed
    from gpulayer.gang.workdir import ShippedDir

    lines, seen = [], []
    job = distributed(run_script, "multinode.py", ["4", "1", "--kill-rank", "3", "--kill-epoch", "1"], nodes=2,
                      procs_per_node=2, max_restarts=1, on_output=lambda rank, stream, line: lines.append(line),
                      workdir=ShippedDir(package_workdir(multinode)[0], restart_from="fresh"))
    job.on_restart(lambda entry, line: seen.append((entry["attempt"], line)))
    job.get(timeout=180)
    assert not [line for line in lines if "Resuming" in line]  # no snapshot anywhere: every node started afresh
    assert "attempt 1: ranks started at epochs [0, 0, 0, 0]" in lines
    status = job.status()
    assert (status["state"], status["attempt"], status["max_restarts"]) == ("succeeded", 1, 1)
    assert len(status["restarts"]) == 1 and status["restarts"][0].startswith("attempt 1 failed (rank 3 on w-")
    assert status["restarts"][0].endswith("killed by SIGKILL); restarting 2 x 2 (attempt 2 of 2), every node from "
                                          "a fresh copy of the shipped directory (--restart-from fresh)")
    assert seen == [(0, status["restarts"][0])]  # on_restart told it once, with the same line
