"""Cancel from anywhere (issue 28, item 3): `gpulayer cancel` from a shell, and Ctrl-C in `gpulayer train`.

Everything runs on the session fleet (w-a and w-b: 2 slots each, w-c: 1). The jobs sent here carry a client
identity of their own (``app._identity``, what config ``client_id`` sets), so `--all-mine` here touches no
other test's jobs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

import gpulayer
from gpulayer import JobFailed, distributed, group, submit, submit_batch
from gpulayer.app import redis_client
from gpulayer.cancel import held_by_workers, unfinished
from gpulayer.lab.fleet import wait_until
from gpulayer.store.gangs import GangStore
from gpulayer.store.sent import sent_by

from .terminal import Terminal


def cli(fleet, *args: str, client_id: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)
    if client_id:
        env["GPULAYER_CLIENT_ID"] = client_id
    return subprocess.run([sys.executable, "-m", "gpulayer", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stopped(value) -> bool:
    return isinstance(value, JobFailed) and value.type_name == "JobStopped"


@pytest.fixture
def me(fleet, monkeypatch):
    """This process sends as a client identity of its own (as `client_id` in its config would make it)."""
    identity = f"test-{uuid.uuid4().hex[:8]}@cancel"
    monkeypatch.setattr(gpulayer.app, "_identity", identity)
    return identity


def nap_gang(seconds):
    import time as _t

    redis_client().rpush(f"test:running:{os.environ['GPULAYER_GANG_ID']}", os.environ["RANK"])
    _t.sleep(seconds)


def gang_running(job) -> None:
    wait_until(lambda: redis_client().llen(f"test:running:{job.id}") == job.spec.world_size, 60,
               "every rank to be running")


def test_cancel_a_job_an_unknown_id_and_a_finished_job(fleet, me):
    done = submit.delay(pow, 2, 10)
    assert done.get(timeout=30) == 1024
    running = submit.delay(time.sleep, 600)
    worker = wait_until(lambda: held_by_workers([running.id]).get(running.id), 30, "the job to be taken by a worker")
    unknown = uuid.uuid4().hex
    out = cli(fleet, "cancel", running.id, done.id, unknown)
    print(out.stdout, out.stderr)
    assert out.returncode == 1  # the unknown id
    assert out.stdout.splitlines() == [f"job {running.id}: cancelled (on worker {worker})",
                                       f"job {done.id}: already finished (SUCCESS)"]
    assert out.stderr.strip() == f"gpulayer cancel: unknown id {unknown}: no job, distributed job or batch with " \
                                 "this id was sent in the last day (check the id; a finished job's result " \
                                 "expires after result_expires)"
    with pytest.raises(JobFailed) as stop:
        running.get(timeout=30)
    assert stop.value.type_name == "JobStopped"


def test_cancel_a_queued_job(fleet, me):
    # Pinned to w-c (1 slot): the first holds it, the second waits in w-c's queue (a worker takes no more
    # than its slots ahead of the ones that run for long).
    pin = {"worker_ids": ["w-c"]}
    first = submit.delay(time.sleep, 600, resources=pin)
    wait_until(lambda: held_by_workers([first.id]), 30, "the first job to be taken")
    queued = submit.delay(time.sleep, 600, resources=pin)
    try:
        out = cli(fleet, "cancel", queued.id)
        assert out.returncode == 0, out.stderr
        assert re.fullmatch(rf"job {queued.id}: cancelled \((queued|on worker w-c)\)\n", out.stdout), out.stdout
    finally:
        first.cancel()
    with pytest.raises(JobFailed):
        queued.get(timeout=30)


def test_cancel_a_batch_and_a_group(fleet, me):
    batch = submit_batch([submit.s(time.sleep, 600) for _ in range(20)])
    grp = group(submit.s(time.sleep, 600) for _ in range(4)).apply_async()
    wait_until(lambda: held_by_workers(batch.ids + [r.id for r in grp.results]), 30, "some job to be running")
    out = cli(fleet, "cancel", batch.id, grp.id)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    for line, (bid, total) in zip(lines, [(batch.id, 20), (grp.id, 4)]):
        found = re.fullmatch(rf"batch {bid}: cancelled (\d+) queued, (\d+) on workers \(0 of {total} had finished\)",
                             line)
        assert found and int(found[1]) + int(found[2]) == total, line
    assert all(stopped(v) for v in batch.get(timeout=60, propagate=False))
    assert all(stopped(v) for v in grp.get(timeout=60, propagate=False))


def test_cancel_a_distributed_job(fleet, me):
    job = distributed(nap_gang, 600, nodes=2, procs_per_node=1)
    gang_running(job)
    out = cli(fleet, "cancel", job.id)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"cancelled 2 x 1 job {job.id}; nothing left running\n"
    with pytest.raises(JobFailed, match="cancelled"):
        job.get(timeout=30)
    assert job.id not in {g["gang_id"] for g in GangStore(redis_client()).active()}
    again = cli(fleet, "cancel", job.id)
    assert (again.returncode, again.stdout) == (0, f"distributed 2 x 1 job {job.id}: already cancelled\n")


def test_cancel_a_distributed_job_that_waits_for_slots(fleet, me):
    """Sent right after a job took w-c's only slot: the gang waits in line, or (the registry a heartbeat
    behind) is reserved on w-c and its agent waits for the job to end. Either way the cancel ends it now."""
    busy = submit.delay(time.sleep, 600, resources={"worker_ids": ["w-c"]})
    try:
        wait_until(lambda: held_by_workers([busy.id]), 30, "w-c's slot to be taken")
        job = distributed(nap_gang, 600, nodes=1, procs_per_node=1, resources={"zone": "us-central1-a"})
        wait_until(lambda: job.status()["state"] in ("waiting", "running"), 30, "the job to be seen")
        out = cli(fleet, "cancel", job.id)
        print(out.stdout, out.stderr)
        assert out.returncode == 0, out.stderr
        assert out.stdout in (f"cancelled 1 x 1 job {job.id} while it waited for slots; nothing had started\n",
                              f"cancelled 1 x 1 job {job.id}; nothing left running\n")
        assert job.id not in GangStore(redis_client()).waiting()  # out of the line: it never starts
        with pytest.raises(JobFailed, match="cancelled"):
            job.get(timeout=30)
        assert redis_client().llen(f"test:running:{job.id}") == 0  # no rank ever ran
        assert GangStore(redis_client()).held().get("w-c", 0) == 0  # its slot went back
    finally:
        busy.cancel()


def test_cancel_needs_a_cluster(gpulayer_home):
    out = subprocess.run([sys.executable, "-m", "gpulayer", "cancel", "--all-mine"], capture_output=True, text=True,
                         timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
                         | {"GPULAYER_HOME": str(gpulayer_home)})
    assert out.returncode == 2
    assert "no cluster to cancel on: set GPULAYER_BROKER_URL" in out.stderr, out.stderr
    bare = subprocess.run([sys.executable, "-m", "gpulayer", "cancel"], capture_output=True, text=True, timeout=60)
    assert (bare.returncode, bare.stderr.strip()) == (2, "gpulayer cancel: error: name the ids to cancel, or give "
                                                         "--all-mine")


def send_a_child():
    return submit.delay(pow, 3, 2).id  # from inside a job: sent as the client that sent this job


def test_a_job_sends_its_children_as_its_client(fleet, me):
    child = submit.delay(send_a_child).get(timeout=30)
    assert child in sent_by(redis_client(), me)


def test_cancel_all_mine_leaves_other_clients_alone(fleet, me, monkeypatch):
    gang = distributed(nap_gang, 600, nodes=1, procs_per_node=1)
    gang_running(gang)  # first: the 5 jobs below take every other slot of the fleet
    mine = [submit.delay(time.sleep, 600)]
    batch = submit_batch([submit.s(time.sleep, 600) for _ in range(3)])
    monkeypatch.setattr(gpulayer.app, "_identity", f"other-{uuid.uuid4().hex[:8]}@cancel")
    theirs = submit.delay(time.sleep, 600)
    try:
        out = cli(fleet, "cancel", "--all-mine", client_id=me)
        print(out.stdout, out.stderr)
        assert out.returncode == 0, out.stderr
        first, second = out.stdout.splitlines()
        found = re.fullmatch(rf"all of {re.escape(me)}'s jobs: cancelled (\d+) queued, (\d+) on workers "
                             r"\(0 of 4 had finished\)", first)
        assert found and int(found[1]) + int(found[2]) == 4, first
        assert second == f"cancelled 1 x 1 job {gang.id}; nothing left running"
        values = batch.get(timeout=60, propagate=False)
        assert all(stopped(v) for v in values)
        with pytest.raises(JobFailed):
            mine[0].get(timeout=30)
        assert unfinished([theirs.id]) == [theirs.id]  # another client's job runs on
        again = cli(fleet, "cancel", "--all-mine", client_id=me)  # what had finished is not counted again
        assert again.stdout == f"all of {me}'s jobs: cancelled 0 queued, 0 on workers (4 of 4 had finished); " \
                               "no distributed job\n", again.stdout
    finally:
        theirs.cancel()


# -- Ctrl-C in `gpulayer train`, in a terminal -------------------------------------------------------------

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path

    pids = Path(sys.argv[1])
    (pids / (os.environ["RANK"] + ".part")).write_text(str(os.getpid()))
    (pids / (os.environ["RANK"] + ".part")).rename(pids / os.environ["RANK"])  # whole, or not there
    print("rank", os.environ["RANK"], "running", flush=True)
    while True:
        time.sleep(0.1)
""")


def train_line(term: Terminal, shape: str) -> str | None:
    """The job id in `gpulayer train`'s first line (``gpulayer train: <id> 2 x 2 ...``), once it is out."""
    found = re.search(rf"gpulayer train: ([0-9a-f]{{32}}) {shape}", term.text())
    return found[1] if found else None


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_in_train_cancels_the_job(fleet, tmp_path, presses):
    project, pids = tmp_path / "proj", tmp_path / "pids"
    project.mkdir()
    pids.mkdir()
    (project / "train.py").write_text(RANK_SCRIPT)
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret, TERM="dumb")
    term = Terminal([sys.executable, "-m", "gpulayer", "train", "--nodes", "2", "--procs-per-node", "2",
                     "train.py", str(pids)], project, env)
    try:
        # The ranks may run before the terminal's reader has the line that names the job: wait for both.
        wait_until(lambda: len(list(pids.glob("[0-9]"))) == 4 and train_line(term, "2 x 2"), 120,
                   f"every rank to run (output so far: {term.text()[-2000:]!r})")
        ranks = [int(p.read_text()) for p in pids.glob("[0-9]")]
        assert all(alive(p) for p in ranks)
        job_id = train_line(term, "2 x 2")
        started = time.perf_counter()
        term.ctrl_c()
        if presses == 2:  # a second Ctrl-C while the first one's cancel is under way
            time.sleep(0.05)
            term.ctrl_c()
        code = term.proc.wait(60)
        took = time.perf_counter() - started
        print(f"Ctrl-C x{presses}: `gpulayer train` exited {code} {took:.2f}s after it")
        term._reader.join(5)
        text = term.text()
        assert code == 130, text
        assert f"gpulayer train: cancelled 2 x 2 job {job_id}; nothing left running" in text, text
        assert "Traceback" not in text, text
        assert not [p for p in ranks if alive(p)], "a rank outlived the cancel"
        status = cli(fleet, "status", "--json")
        assert status.returncode == 0, status.stderr
        assert job_id not in status.stdout  # neither running nor waiting
        assert GangStore(redis_client()).record(job_id)["state"] == "cancelled"
    finally:
        term.close()
        for p in pids.glob("[0-9]"):
            pid = int(p.read_text())
            if alive(pid):
                psutil.Process(pid).kill()


def test_ctrl_c_in_train_with_detach_leaves_the_job_running(fleet, tmp_path):
    project, pids = tmp_path / "proj", tmp_path / "pids"
    project.mkdir()
    pids.mkdir()
    (project / "train.py").write_text(RANK_SCRIPT)
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret, TERM="dumb")
    term = Terminal([sys.executable, "-m", "gpulayer", "train", "--nodes", "1", "--procs-per-node", "2", "--detach",
                     "train.py", str(pids)], project, env)
    job_id = None
    try:
        wait_until(lambda: len(list(pids.glob("[0-9]"))) == 2 and train_line(term, "1 x 2"), 120,
                   f"every rank to run ({term.text()[-2000:]!r})")
        job_id = train_line(term, "1 x 2")
        term.ctrl_c()
        assert term.proc.wait(60) == 130
        term._reader.join(5)
        assert f"gpulayer train: stopped watching; job {job_id} keeps running on the cluster: cancel it with " \
               f"`gpulayer cancel {job_id}`" in term.text(), term.text()
        ranks = [int(p.read_text()) for p in pids.glob("[0-9]")]
        assert all(alive(p) for p in ranks)
        assert GangStore(redis_client()).record(job_id)["state"] == "running"
        out = cli(fleet, "cancel", job_id)
        assert out.stdout == f"cancelled 1 x 2 job {job_id}; nothing left running\n", out.stderr
        assert not [p for p in ranks if alive(p)]
        job_id = None
    finally:
        job_id = job_id or train_line(term, "1 x 2")  # a failed wait: still cancel what runs (its slots)
        term.close()
        if job_id:
            cli(fleet, "cancel", job_id)


# -- short ids (issue 40, item 6) ---------------------------------------------------------------------------------
def test_cancel_takes_the_12_characters_status_shows_of_a_job_a_batch_and_a_distributed_job(fleet, me):
    running = submit.delay(time.sleep, 600)
    batch = submit_batch([submit.s(time.sleep, 600) for _ in range(3)])
    # The registry's busy counts come with each worker's heartbeat (every second): a gang placed before they
    # show the four naps is put beside one of them and waits for it (600 s) by design, so the gang goes once
    # every nap is counted.
    wait_until(lambda: sum(w.busy for w in gpulayer.app.registry().snapshot()) == 4, 30,
               "the four naps to be counted busy in the registry")
    job = distributed(nap_gang, 600, nodes=1, procs_per_node=1)
    try:
        gang_running(job)
    except TimeoutError:
        cli(fleet, "cancel", running.id, batch.id, job.id)
        raise
    wait_until(lambda: held_by_workers([running.id]), 30, "the job to be taken by a worker")
    out = cli(fleet, "cancel", running.id[:12], batch.id[:12], job.id[:12])
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"job {running.id}: cancelled (on worker "), lines
    assert lines[1].startswith(f"batch {batch.id}: cancelled "), lines
    assert lines[2] == f"cancelled 1 x 1 job {job.id}; nothing left running", lines
    with pytest.raises(JobFailed):
        running.get(timeout=30)
    assert all(stopped(v) for v in batch.get(timeout=60, propagate=False))
    with pytest.raises(JobFailed, match="cancelled"):
        job.get(timeout=30)


def test_an_ambiguous_or_too_short_prefix_is_refused_naming_what_it_matches(fleet, me):
    from gpulayer.errors import AmbiguousId, UnknownId
    from gpulayer.ids import resolve

    stem = f"ambig{uuid.uuid4().hex[:8]}"
    first = submit.apply_async((pow, 2, 3), task_id=f"{stem}-one")
    second = submit.apply_async((pow, 2, 4), task_id=f"{stem}-two")
    assert (first.get(timeout=30), second.get(timeout=30)) == (8, 16)
    out = cli(fleet, "cancel", stem, stem[:4], f"{stem}-o")
    assert out.returncode == 1
    errs = out.stderr.splitlines()
    assert errs[0] == f"gpulayer cancel: ambiguous: matches {stem}-one (job), {stem}-two (job); give more of the id"
    assert errs[1].startswith(f"gpulayer cancel: unknown id {stem[:4]}: ") and "at least 6 characters" in errs[1]
    assert out.stdout.splitlines() == [f"job {stem}-one: already finished (SUCCESS)"]
    with pytest.raises(AmbiguousId) as e:
        resolve(stem)
    assert e.value.matches == (f"{stem}-one", f"{stem}-two") and isinstance(e.value, LookupError)
    assert resolve(f"{stem}-tw") == f"{stem}-two" and resolve(f"{stem}-one") == f"{stem}-one"
    with pytest.raises(UnknownId, match="no job or batch with this id or starting with it"):
        resolve(uuid.uuid4().hex, kinds=("job", "batch"))
