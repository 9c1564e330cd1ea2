"""Preemption on real workers: a gang of higher priority stops a running one (SIGTERM, SIGKILL after the grace),
which is requeued whole, its restarts untouched. The victim choice alone is ``test_preemption_choice.py``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

import gpulayer
from gpulayer import distributed
from gpulayer.app import redis_client
from gpulayer.lab.fleet import wait_until
from gpulayer.store.gangs import GangStore
from tests.fleets import running_fleet

GRACE, MIN_RUNTIME = 3.0, 2.0
SETTINGS = {"GPULAYER_PREEMPT_GRACE": str(GRACE), "GPULAYER_PREEMPT_MIN_RUNTIME": str(MIN_RUNTIME)}


@pytest.fixture(scope="module")
def full_fleet(tmp_path_factory):
    """Two workers of 2 slots: a 2 x 2 gang fills it."""
    env = dict(os.environ, **SETTINGS)
    workers = {name: dict(slots=2, zone="pre-1a", region="pre", env=env) for name in ("p1", "p2")}
    with running_fleet(tmp_path_factory.mktemp("preempt"), workers) as f:
        yield f


@pytest.fixture
def fleet(full_fleet):
    full_fleet.connect()
    yield full_fleet
    store = GangStore(redis_client())
    wait_until(lambda: not store.held() and not store.waiting(), 60, "every slot free and no gang waiting")


def runs_until_sigterm(where: str, ignore: bool | str = False):
    """A rank of a first attempt: runs until SIGTERM (and records it); ``ignore``: goes on after it (SIGKILL
    ends it), ``"node 1"``: only node 1's ranks do. A later attempt returns at once, saying which."""
    import signal
    import time

    rank, attempt = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt:
        return f"attempt {attempt}"

    ignores = ignore is True or ignore == f"node {os.environ['GROUP_RANK']}"

    def on_sigterm(signum, frame):
        Path(where, f"sigterm-{rank}").write_text("1")
        if not ignores:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    Path(where, f"started-{rank}").write_text("1")
    while True:
        time.sleep(0.02)


def holds_until_released(key: str):
    r = gpulayer.app.redis_client()
    assert r.blpop([key], timeout=120), f"never released: {key}"
    return os.environ.get("RANK", "job")


def _started(where: Path, n: int) -> bool:
    return len(list(where.glob("started-*"))) == n


def test_a_higher_priority_gang_preempts_a_full_fleet_and_the_victim_is_requeued_whole(fleet, tmp_path):
    low = distributed(runs_until_sigterm, str(tmp_path), nodes=2, procs_per_node=2, max_restarts=0, timeout=600)
    wait_until(lambda: _started(tmp_path, 4), 120, "the low-priority gang's 4 ranks to start")
    release = f"test:release:{uuid.uuid4().hex}"
    high = distributed(holds_until_released, release, nodes=2, procs_per_node=2, priority=5, timeout=600)
    assert set(high.wait_placement(timeout=120).workers) == {"p1", "p2"}
    # Every rank of the victim got SIGTERM (and saved, here a file); the victim waits again, not failed.
    assert sorted(p.name for p in tmp_path.glob("sigterm-*")) == [f"sigterm-{r}" for r in range(4)]
    wait_until(lambda: low.status()["state"] == "waiting" and "waiting for" in low.status()["reason"], 60,
               "the preempted gang to wait again")
    st = low.status()
    assert st["preemptions"] == 1 and st["attempt"] == 1
    assert st["preempted"] == f"preempted by {high.id} (priority 5 over 0)"
    assert st["reason"].startswith(f"preempted by {high.id} (priority 5 over 0); waiting for 2 workers")
    assert st["preempted_attempts"] == [
        f"attempt 1 preempted by {high.id} (priority 5 over 0); requeued 2 x 2 (attempt 2; a preemption uses "
        "none of the 0 restarts)"]
    first = low.attempts[0]
    assert first["outcome"] == "preempted" and first["preempted_by"] == high.id
    assert first["preempted_after"] >= MIN_RUNTIME  # never one that has run less than preempt_min_runtime
    # `gpulayer status` shows it.
    from gpulayer.status import collect

    rows = {g["id"]: g for g in collect()["gangs"]}
    assert rows[low.id]["preemptions"] == 1 and rows[low.id]["reason"].startswith(f"preempted by {high.id}")
    assert rows[high.id]["priority"] == 5
    redis_client().rpush(release, *["go"] * 4)
    assert high.get(timeout=120) == ["0", "1", "2", "3"]
    # Requeued with max_restarts=0 and still run again: a preemption is no failure.
    assert low.get(timeout=120) == ["attempt 1"] * 4
    # The ranks that exited within the grace were not killed.
    nodes = GangStore(redis_client()).nodes(low.id, 0)
    assert sorted(n["state"] for n in nodes.values()) == ["preempted", "preempted"]
    assert all(code == 0 for n in nodes.values() for code in n["exit_codes"])


def test_a_victim_that_ignores_sigterm_is_sigkilled_after_the_grace(fleet, tmp_path):
    low = distributed(runs_until_sigterm, str(tmp_path), True, nodes=2, procs_per_node=2, timeout=600)
    wait_until(lambda: _started(tmp_path, 4), 120, "the low-priority gang's 4 ranks to start")
    release = f"test:release:{uuid.uuid4().hex}"
    high = distributed(holds_until_released, release, nodes=2, procs_per_node=2, priority=3, timeout=600)
    high.wait_placement(timeout=120)
    assert len(list(tmp_path.glob("sigterm-*"))) == 4  # told, and went on
    nodes = GangStore(redis_client()).nodes(low.id, 0)
    assert [code for n in nodes.values() for code in n["exit_codes"]] == [-9] * 4  # SIGKILL
    stopped = [n["stopped_at"] for n in nodes.values()]
    assert all(s is not None for s in stopped)
    redis_client().rpush(release, *["go"] * 4)
    high.get(timeout=120)
    assert low.get(timeout=120) == ["attempt 1"] * 4


def test_a_gang_behind_the_preempting_one_does_not_take_the_slots_coming_back(fleet, tmp_path):
    # Node 0 of the victim stops at once, node 1 only when SIGKILLed after the grace: in between, passes see
    # node 0's slots free.
    low = distributed(runs_until_sigterm, str(tmp_path), "node 1", nodes=2, procs_per_node=2, timeout=600)
    wait_until(lambda: _started(tmp_path, 4), 120, "the low-priority gang's 4 ranks to start")
    release = f"test:release:{uuid.uuid4().hex}"
    small = distributed(holds_until_released, release, nodes=1, procs_per_node=1, timeout=600)  # priority 0
    seen: list[str] = []
    try:
        wait_until(lambda: seen.append(small.status()["reason"]) or "waiting for 1 workers" in seen[-1], 60,
                   "the small gang to wait")
    except TimeoutError:
        pytest.fail(f"the small gang's reason: {seen[-1]!r}; its status {small.status()}")
    high = distributed(holds_until_released, release, nodes=2, procs_per_node=2, priority=5, timeout=600)
    high.wait_placement(timeout=120)
    # The victim's node 0 gave its slots back seconds before node 1: they waited for the gang that preempted.
    assert small.status()["state"] == "waiting" and small.status()["preemptions"] == 0
    redis_client().rpush(release, *["go"] * 5)
    assert high.get(timeout=120) == ["0", "1", "2", "3"] and small.get(timeout=120) == ["0"]
    assert len(small.attempts) == 1 and low.get(timeout=120) == ["attempt 1"] * 4


def test_a_gang_of_equal_or_lower_priority_only_waits(fleet, tmp_path):
    release = f"test:release:{uuid.uuid4().hex}"
    running = distributed(holds_until_released, release, nodes=2, procs_per_node=2, priority=4, timeout=600)
    running.wait_placement(timeout=120)
    same = distributed(holds_until_released, release, nodes=1, procs_per_node=2, priority=4, timeout=600)
    lower = distributed(holds_until_released, release, nodes=1, procs_per_node=2, priority=1, timeout=600)
    wait_until(lambda: "waiting for 1 workers" in lower.status()["reason"], 60, "the lower gang's reason")
    wait_until(lambda: "waiting for 1 workers" in same.status()["reason"], 60, "the equal gang's reason")
    assert running.status()["state"] == "running" and running.status()["preemptions"] == 0
    # The line puts the higher priority first, whatever the arrival.
    store = GangStore(redis_client())
    assert store.waiting() == [same.id, lower.id]
    redis_client().rpush(release, *["go"] * 8)
    assert running.get(timeout=120) == ["0", "1", "2", "3"]
    same.get(timeout=120), lower.get(timeout=120)


# -- a Trainer fit, preempted: it checkpoints on SIGTERM and resumes where it stopped -----------------------
STEPS = 40  # 10 epochs of 64 samples in steps of 4 ranks x 4


def _dataset():
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g))


def _net(marks: str | None = None):
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from gpulayer.trainer import Module

    class Net(Module):
        """A linear model; with ``marks``, rank 0 records the steps each attempt trains (slowly on attempt 0)."""

        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(6, 1)

        def training_step(self, batch, batch_idx):
            if marks and self.global_rank == 0:
                import time

                attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
                with open(os.path.join(marks, "steps"), "a") as f:
                    f.write(f"{attempt} {self.global_step}\n")
                if attempt == 0:
                    time.sleep(0.1)  # long enough to be preempted mid-fit
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

        def train_dataloader(self):  # no shuffle: the same order in every attempt
            return DataLoader(_dataset(), batch_size=4)

    return Net()


def _trainer(root: Path, **kw):
    from gpulayer.trainer import Trainer

    return Trainer(accelerator="cpu", num_nodes=2, devices=2, max_epochs=10, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(root), **kw)


def _steps(marks: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in (marks / "steps").read_text().splitlines():
        attempt, step = (int(x) for x in line.split())
        out.setdefault(attempt, []).append(step)
    return out


def test_a_preempted_trainer_fit_checkpoints_on_sigterm_and_resumes_to_the_same_weights(fleet, tmp_path):
    import threading

    import torch

    from gpulayer.trainer import seed_everything

    seed_everything(1)
    reference = _net()
    plain = _trainer(tmp_path / "plain")
    plain.fit(reference)
    assert plain.global_step == STEPS and [a["outcome"] for a in plain.fit_info["attempts"]] == ["succeeded"]

    marks = tmp_path / "marks"
    marks.mkdir()
    high: dict = {}

    def preempt_it() -> None:
        try:
            wait_until(lambda: (marks / "steps").exists() and len(_steps(marks).get(0, [])) >= 3, 300,
                       "the fit to train a few steps", every=0.05)
            job = distributed(os.getpid, nodes=2, procs_per_node=2, priority=5, timeout=600)
            high["id"], high["ranks"] = job.id, job.get(timeout=300)
        except BaseException as err:
            high["error"] = err

    thread = threading.Thread(target=preempt_it, daemon=True)
    thread.start()
    seed_everything(1)
    model = _net(str(marks))
    trainer = _trainer(tmp_path / "root")  # max_restarts=0: a preemption uses none
    trainer.fit(model)
    thread.join(60)
    assert "error" not in high and len(high.get("ranks", [])) == 4, high
    info = trainer.fit_info
    assert [a["outcome"] for a in info["attempts"]] == ["preempted", "succeeded"]
    assert info["attempts"][0]["preempted_by"] == high["id"]
    assert info["attempts"][0]["failure"] == f"preempted by {high['id']} (priority 5 over 0)"
    # Rank 0 saved within the grace, at the end of a batch; the requeued attempt began right there.
    saved = info["resumed_from"]
    assert Path(saved["path"]).name == f"preempted-step={saved['global_step']}.ckpt"
    assert Path(saved["path"]).parent == tmp_path / "root" / "checkpoints"
    steps = _steps(marks)
    assert steps[0] == list(range(saved["global_step"])) and steps[1] == list(range(saved["global_step"], STEPS))
    assert trainer.global_step == STEPS
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], rtol=0, atol=1e-6)


# -- one convention: for jobs too, the higher priority runs first -------------------------------------------
def records_priority(key: str, priority: int) -> int:
    gpulayer.app.redis_client().rpush(key, priority)
    return priority


def test_queued_jobs_of_higher_priority_run_first(fleet):
    from gpulayer import Resources, submit

    release, order = f"test:release:{uuid.uuid4().hex}", f"test:order:{uuid.uuid4().hex}"
    on_p1 = Resources(worker_ids=["p1"])
    blockers = [submit.delay(holds_until_released, release, resources=on_p1) for _ in range(2)]
    client = redis_client()
    wait_until(lambda: {w.id: w.busy for w in gpulayer.app.registry().snapshot()}.get("p1") == 2, 60,
               "p1's two slots busy")
    jobs = [submit.apply_async((records_priority, order, p), {"resources": on_p1}, priority=p) for p in (0, 9, 3)]
    jobs.append(submit.delay(records_priority, order, 0, resources=on_p1))  # none given: 0, the lowest
    client.rpush(release, "go")  # one slot frees: the queued jobs run one by one on it
    assert [j.get(timeout=120) for j in jobs] == [0, 9, 3, 0]
    assert [int(x) for x in client.lrange(order, 0, -1)] == [9, 3, 0, 0]
    client.rpush(release, "go")
    for b in blockers:
        b.get(timeout=120)


# -- a `gpulayer train` script, preempted: it saves in its working directory and resumes from there ---------
SCRIPT = '''
import json, os, signal, sys, time
import torch, torch.distributed as dist

stop = False
def on_sigterm(signum, frame):  # a preemption: finish the step, save, exit
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_sigterm)

dist.init_process_group("gloo")
rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
start = json.load(open("snapshot.json"))["epoch"] if os.path.exists("snapshot.json") else 0
print(f"attempt {attempt}: starts at epoch {start}", flush=True)
for epoch in range(start, 60):
    t = torch.ones(1)
    dist.all_reduce(t)  # a training step
    if attempt == 0:
        time.sleep(0.05)
        open(f"epoch-{rank}", "w").write(str(epoch))
    flag = torch.tensor([float(stop)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops after the same step
    if flag.item():
        if rank == 0:
            json.dump({"epoch": epoch + 1}, open("snapshot.json.tmp", "w"))
            os.replace("snapshot.json.tmp", "snapshot.json")
        sys.exit(143)  # not finished: the attempt counts as preempted, and is requeued
print(f"rank {rank} done", flush=True)
'''


def test_a_preempted_train_script_resumes_from_its_working_directory(fleet, tmp_path):
    from gpulayer.cli.train import package_workdir, run_script
    from gpulayer.gang.workdir import ShippedDir

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    lines: list[tuple[int, str]] = []
    low = distributed(run_script, "train.py", [], nodes=2, procs_per_node=2, timeout=600,
                      on_output=lambda rank, stream, line: lines.append((rank, line)),
                      workdir=ShippedDir(package_workdir(proj)[0]))
    wait_until(lambda: any(line == "attempt 0: starts at epoch 0" for _, line in lines)
               and len([1 for _, line in lines if "starts at epoch" in line]) == 4, 120, "the script to start")
    wait_until(lambda: low.status()["state"] == "running", 60, "the script to run")
    high = distributed(os.getpid, nodes=2, procs_per_node=2, priority=9, timeout=600)
    assert len(high.get(timeout=300)) == 4
    low.get(timeout=300)
    starts = sorted(line for _, line in lines if line.startswith("attempt 1: starts at epoch"))
    assert len(starts) == 4 and len(set(starts)) == 1, lines  # every rank, on both nodes, from node 0's snapshot
    resumed = int(starts[0].rsplit(" ", 1)[1])
    assert resumed > 0
    assert sorted(line for _, line in lines if line.endswith(" done")) == [f"rank {r} done" for r in range(4)]
    first = low.attempts[0]
    assert first["outcome"] == "preempted" and first["restart_from"].startswith("every node from node 0's files")
