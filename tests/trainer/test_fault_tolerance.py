"""Trainer(num_nodes=2, devices=2, max_restarts=1) survives a failing rank and a lost worker.

On a fleet of three workers with two slots each, a 2 x 2 fit checkpoints every 3 steps (``save_last=True``).
On attempt 0, right after the checkpoint of step 6 (mid-epoch 1), a rank raises once, or the whole process
group of the worker running node 1 is SIGKILLed. The fit must finish on live workers from that checkpoint
(the steps rank 0 trains on attempt 1 start at 6), with weights equal to an uninterrupted run's: same seed,
same data order, and SGD with momentum, so a resume that lost the optimizer state would not match.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer, seed_everything
from gpulayer.trainer.callbacks import ModelCheckpoint
from gpulayer.lab.fleet import wait_until
from tests.fleets import need, running_fleet

WORKERS = ("ft1", "ft2", "ft3")
EVERY = 3  # steps between checkpoints
FAIL_AT = 6  # the step after whose checkpoint attempt 0 fails: epoch 1, 2 of its 4 batches done
STEPS = 12  # 3 epochs of 64 samples in steps of 4 ranks x 4
BLOCK_S = 120.0  # how long node 1's ranks wait to be killed before giving up


@pytest.fixture(scope="module")
def ft_fleet(tmp_path_factory):
    setsid = shutil.which("setsid")
    need(setsid is not None, "no setsid on PATH (util-linux): the workers need process groups of their own")
    # setsid: each worker leads its own process group, so the test can SIGKILL that group (never its own)
    workers = {name: dict(slots=2, zone="eu-1a", prefix=[setsid]) for name in WORKERS}
    with running_fleet(tmp_path_factory.mktemp("ft-fleet"), workers) as f:
        yield f


@pytest.fixture
def fleet(ft_fleet):
    from gpulayer.app import redis_client
    from gpulayer.store.gangs import GangStore

    ft_fleet.connect()
    yield ft_fleet
    # a dead worker's holds go once a janitor buries it
    wait_until(lambda: GangStore(redis_client()).held() == {}, 30, "every slot to be free after the test")


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g))


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _wait_file(path: Path, timeout: float) -> str:
    wait_until(path.exists, timeout, f"{path} to appear", every=0.05)
    return path.read_text()


class Net(Module):
    """A linear model; ``fail`` ("raise" or "kill") makes attempt 0 fail right after the step-6 checkpoint."""

    def __init__(self, marks: str | None = None, fail: str | None = None):
        super().__init__()
        self.layer = nn.Linear(6, 1)
        self.marks, self.fail = marks, fail

    def training_step(self, batch, batch_idx):
        if self.marks and self.global_rank == 0:  # which steps each attempt trained
            with open(os.path.join(self.marks, "steps"), "a") as f:
                f.write(f"{_attempt()} {self.global_step}\n")
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self):  # no shuffle: the order is the same in every attempt
        return DataLoader(_dataset(), batch_size=4)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # runs after the callbacks' hook: ModelCheckpoint has saved step 6 on rank 0 by now
        if self.fail is None or _attempt() != 0 or self.global_step != FAIL_AT:
            return
        marks = Path(self.marks)
        if self.global_rank == 0:
            (marks / "saved").write_text(str(self.global_step))
            return  # on to step 7, where it waits in the gradient all-reduce for node 1
        if self.fail == "raise" and self.global_rank == 3:
            _wait_file(marks / "saved", BLOCK_S)
            raise ValueError("rank three fails once")
        if self.fail == "kill" and self.global_rank >= 2:
            if self.global_rank == 2:
                (marks / "node1").write_text(os.environ["GPULAYER_WORKER_ID"])
            time.sleep(BLOCK_S)  # the test kills this worker meanwhile
            raise RuntimeError(f"node 1 was not killed within {BLOCK_S}s")


def _trainer(ckpt_dir: Path, **kw) -> Trainer:
    ckpt = ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=EVERY, save_last=True)
    return Trainer(accelerator="cpu", num_nodes=2, devices=2, max_epochs=3, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=[ckpt], **kw)


@pytest.fixture(scope="module")
def uninterrupted(ft_fleet, tmp_path_factory):
    ft_fleet.connect()
    seed_everything(1)
    model = Net()
    trainer = _trainer(tmp_path_factory.mktemp("ckpt-uninterrupted"))
    trainer.fit(model)
    assert trainer.global_step == STEPS and len(trainer.fit_info["attempts"]) == 1
    return {k: v.clone() for k, v in model.state_dict().items()}


def _steps_by_attempt(marks: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in (marks / "steps").read_text().splitlines():
        attempt, step = (int(x) for x in line.split())
        out.setdefault(attempt, []).append(step)
    return out


def _assert_resumed_and_equal(trainer: Trainer, model: Net, marks: Path, reference: dict) -> None:
    info = trainer.fit_info
    assert trainer.global_step == STEPS and info["restarts"] == 1 and len(info["attempts"]) == 2
    assert [a["outcome"] for a in info["attempts"]] == ["failed", "succeeded"]
    assert info["resumed_from"]["global_step"] == FAIL_AT and info["resumed_from"]["path"].endswith(".ckpt")
    steps = _steps_by_attempt(marks)
    assert steps[0][:FAIL_AT] == list(range(FAIL_AT)) and max(steps[0]) <= FAIL_AT  # at most into step 7
    assert steps[1] == list(range(FAIL_AT, STEPS))  # attempt 1 lost nothing: it began at the checkpoint
    for name, value in model.state_dict().items():
        # Bitwise: the same 2 x 2 topology sums the same numbers in the same order in both runs.
        assert torch.equal(value, reference[name]), (name, value, reference[name])


def test_a_rank_that_raises_once_is_restarted_and_resumes_from_the_last_checkpoint(fleet, uninterrupted, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    seed_everything(1)
    model = Net(str(marks), fail="raise")
    trainer = _trainer(tmp_path / "ckpt", max_restarts=1)
    trainer.fit(model)
    first = trainer.fit_info["attempts"][0]
    assert first["failed_rank"] == 3 and "ValueError" in first["failure"] and "rank three" in first["failure"]
    assert first["lost_workers"] == []
    _assert_resumed_and_equal(trainer, model, marks, uninterrupted)


def test_a_worker_killed_mid_fit_the_fit_finishes_on_the_live_workers(fleet, uninterrupted, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    killed: dict = {}

    def kill_node_1() -> None:
        try:
            victim = _wait_file(marks / "node1", 300)
            _wait_file(marks / "saved", 60)
            proc = fleet.workers[victim]
            if not os.getpgid(proc.pid) == proc.pid != os.getpgid(0):
                raise AssertionError(f"worker {victim} does not lead a process group of its own")  # never ours
            tree = psutil.Process(proc.pid).children(recursive=True)  # its pool and its two ranks
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and its pool; its ranks die with it (PDEATHSIG)
            proc.wait(30)
            killed["worker"], killed["ranks_left"] = victim, psutil.wait_procs(tree, timeout=30)[1]
        except BaseException as err:
            killed["error"] = err

    killer = threading.Thread(target=kill_node_1, daemon=True)
    killer.start()
    seed_everything(1)
    model = Net(str(marks), fail="kill")
    trainer = _trainer(tmp_path / "ckpt", max_restarts=1)
    trainer.fit(model)
    killer.join(30)
    assert "error" not in killed and "worker" in killed, killed
    victim = killed["worker"]
    assert killed["ranks_left"] == []  # no rank of the dead worker outlived it
    first, second = trainer.fit_info["attempts"]
    assert first["workers"][1] == victim and first["lost_workers"] == [victim]
    assert f"worker {victim} (node 1) stopped heartbeating" in first["failure"]
    assert victim not in second["workers"] and len(set(second["workers"])) == 2
    assert set(second["workers"]) <= set(WORKERS) - {victim} and trainer.fit_info["workers"] == second["workers"]
    _assert_resumed_and_equal(trainer, model, marks, uninterrupted)
