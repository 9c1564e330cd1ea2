"""A job's output comes home: captured on the worker, printed in the client that sent it, kept as its tail.

Pure units for the line splitter, the limiter and the tail's bounds; the rest against the session's real
Redis and worker processes, with clients run as scripts (what a user runs) where their output is the point.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from gpulayer import distributed, submit, submit_batch
from gpulayer.app import redis_client
from gpulayer.lab.fleet import wait_until
from gpulayer.output import lines as L
from gpulayer.output.sink import JobOutput
from gpulayer.store import keys
from gpulayer.store.gangs import GangStore


# -- pure units ---------------------------------------------------------------------------------------------
def test_splitter_gives_whole_lines_across_writes_and_keeps_a_partial_one():
    s = L.LineSplitter()
    assert s.write("hel") == []
    assert s.write("lo\nwor") == ["hello"]
    assert s.write("ld\n\nlast") == ["world", ""]
    assert s.rest() == "last"
    assert s.rest() is None


def test_splitter_keeps_what_a_terminal_shows_of_a_redrawn_line():
    s = L.LineSplitter()
    assert s.write("10%\r50%\r100%\n") == ["100%"]
    assert s.write("windows line\r\n") == ["windows line"]


def test_a_line_too_long_is_cut_saying_so():
    s = L.LineSplitter()
    (line,) = s.write("x" * (L.MAX_LINE + 10) + "\n")
    assert line.startswith("x" * L.MAX_LINE) and line.endswith("[gpulayer: line cut, 10 more characters]")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_limiter_admits_a_burst_then_drops_and_says_how_many():
    clock = Clock()
    lim = L.Limiter(rate_lines=10, burst_lines=5, rate_bytes=1e9, burst_bytes=1e9, clock=clock)
    assert [lim.admit("a") for _ in range(8)] == [True] * 5 + [False] * 3
    note = lim.note()
    assert note.startswith("[gpulayer: 3 lines dropped") and "10 lines" in note
    assert lim.note() is None  # told once
    clock.now += 0.2  # two lines' worth of refill
    assert [lim.admit("a") for _ in range(3)] == [True, True, False]
    assert lim.note_due() is None  # the last note was 0.2 s ago: a flood gets one a second
    clock.now += L.NOTE_EVERY
    assert lim.admit("a") and lim.note_due().startswith("[gpulayer: 1 line dropped")


def test_limiter_counts_characters_and_a_refused_big_line_costs_no_line_token():
    clock = Clock()
    lim = L.Limiter(rate_lines=1, burst_lines=2, rate_bytes=1, burst_bytes=100, clock=clock)
    assert not lim.admit("y" * 200)
    assert lim.admit("small") and lim.admit("small")  # both line tokens still there
    assert lim.dropped == 1


def test_tail_budget_keeps_the_newest_lines_within_both_bounds():
    b = L.TailBudget(max_lines=3, max_bytes=10)
    assert [b.add(1) for _ in range(2)] == [1, 2]
    assert b.maxlen() == 3  # not full: an earlier run's lines (a retry's) stay beside these
    assert [b.add(1) for _ in range(3)] == [3, 3, 3]
    assert b.maxlen() == 3 and b.full
    assert b.add(9) == 2  # 1 + 9 characters: the older ones go
    assert b.add(50) == 1  # the newest line always stays, even alone over the bound
    assert b.maxlen() == 1


def test_source_prefixes_and_the_wire_round_trip():
    job = L.Source("j1", "square", "w-a", 42)
    rank = L.Source("g1", "train", "w-b", 0, rank=2)
    assert job.prefix() == "(square pid=42 on w-a)"
    assert rank.prefix() == "(rank 2 on w-b)"
    chunk = L.Chunk(rank, "chan", [(L.OUT, "hi", 1), (L.ERR, "oops", 2)])
    assert list(L.decode_batch([chunk.wire()])) == [(rank, L.OUT, "hi"), (rank, L.ERR, "oops")]


class RecordingSink:
    def __init__(self):
        self.lines, self.flushes = [], 0

    def add(self, out, stream, text):
        out.budget.add(len(text))
        self.lines.append((stream, text))

    def flush(self):
        self.flushes += 1


def test_job_output_is_free_until_it_prints_and_sends_its_last_lines_as_it_ends():
    sink = RecordingSink()
    quiet = JobOutput(lambda: sink, "j0", "f", "w", 1, "c")
    quiet.close()
    assert sink.lines == [] and sink.flushes == 0 and quiet.sink is None

    out = JobOutput(lambda: sink, "j1", print, "w", 1, "c")
    assert out.write(L.OUT, "one\ntwo") == ["one"]
    out.close()
    assert sink.lines == [(L.OUT, "one"), (L.OUT, "two")] and sink.flushes == 1
    assert out.source.fn == "print"


def test_a_url_a_job_prints_reaches_the_client_with_its_password_masked():
    sink = RecordingSink()
    out = JobOutput(lambda: sink, "j1", "f", "w", 1, "c")
    out.write(L.OUT, "connecting to redis://:pw123456@10.0.0.1:6379/0\nplain line\n")
    assert sink.lines == [(L.OUT, "connecting to redis://:***@10.0.0.1:6379/0"), (L.OUT, "plain line")]


def test_job_output_tells_what_it_dropped_at_the_end():
    sink = RecordingSink()
    out = JobOutput(lambda: sink, "j1", "f", "w", 1, "c")
    out._ready()
    out.limiter = L.Limiter(rate_lines=0.0, burst_lines=2, clock=Clock())
    for i in range(5):
        out.line(L.OUT, str(i))
    out.close()
    assert sink.lines[:2] == [(L.OUT, "0"), (L.OUT, "1")]
    assert sink.lines[2][0] == L.ERR and sink.lines[2][1].startswith("[gpulayer: 3 lines dropped")


# -- against real workers -----------------------------------------------------------------------------------
def _run(script_text: str, fleet, tmp_path, *args, timeout=120) -> subprocess.CompletedProcess:
    script = tmp_path / "client_script.py"
    script.write_text(textwrap.dedent(script_text))
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env)


def _cli(fleet, *args, timeout=60) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)
    return subprocess.run([sys.executable, "-m", "gpulayer", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


PRINTS_AND_LOGS = """
    import logging, sys, gpulayer
    from gpulayer import submit

    def chatty(tag):
        print("printed", tag)
        logging.getLogger("app").warning("logged %s", tag)
        return tag

    if __name__ == "__main__":
        gpulayer.init(log_to_client=sys.argv[1] == "on")
        h = submit.delay(chatty, "u-7f3a")
        print("value", h.get(timeout=60))
        print("id", h.id)
        print("kept", repr(h.logs()))
"""


def test_a_jobs_print_and_logging_lines_reach_the_client_and_its_tail(fleet, tmp_path):
    out = _run(PRINTS_AND_LOGS, fleet, tmp_path, "on")
    assert out.returncode == 0, out.stderr
    # stdout lines to stdout, logging to stderr, each prefixed with the function, its process and worker
    assert re.search(r"^\(chatty pid=\d+ on w-[abc]\) printed u-7f3a$", out.stdout, re.M), out.stdout
    assert re.search(r"^\(chatty pid=\d+ on w-[abc]\) WARNING app: logged u-7f3a$", out.stderr, re.M), out.stderr
    assert "kept 'printed u-7f3a\\nWARNING app: logged u-7f3a\\n'" in out.stdout
    job_id = re.search(r"^id (\S+)$", out.stdout, re.M).group(1)
    cli = _cli(fleet, "logs", job_id)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == "printed u-7f3a\n"  # stdout to stdout, the rest to stderr, as `docker logs`
    assert cli.stderr == "WARNING app: logged u-7f3a\n"
    short = _cli(fleet, "logs", job_id[:12])  # the 12 characters `gpulayer status` shows (gpulayer/ids.py)
    assert (short.returncode, short.stdout) == (0, "printed u-7f3a\n"), short.stderr


def test_log_to_client_off_prints_nothing_here_but_keeps_the_tail(fleet, tmp_path):
    out = _run(PRINTS_AND_LOGS, fleet, tmp_path, "off")
    assert out.returncode == 0, out.stderr
    assert "(chatty" not in out.stdout + out.stderr
    assert "kept 'printed u-7f3a\\nWARNING app: logged u-7f3a\\n'" in out.stdout


def test_a_job_that_prints_nothing_leaves_no_tail(fleet):
    h = submit.delay(pow, 2, 5)
    assert h.get(timeout=60) == 32
    assert h.logs() == ""
    assert not redis_client().exists(keys.job_output(h.id))


def test_a_batchs_jobs_keep_each_their_own_lines(fleet):
    def say(i):
        print(f"job {i} here")
        return i

    b = submit_batch([submit.s(say, i) for i in range(40)])
    assert b.get(timeout=120) == list(range(40))
    from gpulayer.job_handle import JobHandle

    for i in (0, 17, 39):
        assert JobHandle(b.ids[i]).logs() == f"job {i} here\n"


def test_a_flood_is_limited_with_a_line_saying_so_and_the_tail_stays_bounded(fleet):
    def flood(n):
        for i in range(n):
            print("line", i)
        return n

    h = submit.delay(flood, 30_000)
    assert h.get(timeout=120) == 30_000
    kept = h.logs().splitlines()
    assert kept[0] == "line 0"
    dropped = [line for line in kept if line.startswith("[gpulayer: ")]
    assert dropped and "lines dropped" in dropped[-1]
    total = sum(int(re.search(r"(\d+) lines? dropped", d).group(1)) for d in dropped)
    assert len(kept) - len(dropped) + total == 30_000  # every line is kept or counted as dropped
    assert len(kept) < 30_000


def test_lines_of_a_jobs_own_jobs_come_home_too(fleet, tmp_path):
    out = _run("""
        import gpulayer
        from gpulayer import submit

        def inner():
            print("from the inner job")
            return 1

        def outer():
            return submit.delay(inner).id

        if __name__ == "__main__":
            gpulayer.init()
            inner_id = submit.delay(outer).get(timeout=60)
            print("value", submit.AsyncResult(inner_id).get(timeout=60))
    """, fleet, tmp_path)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^\(inner pid=\d+ on w-[abc]\) from the inner job$", out.stdout, re.M), out.stdout


def test_gpulayer_logs_follow_prints_lines_as_they_come_until_the_job_ends(fleet):
    def slow_printer():
        import time
        for i in range(3):
            print("tick", i, flush=True)
            time.sleep(0.5)
        return "done"

    h = submit.delay(slow_printer)
    wait_until(lambda: redis_client().exists(keys.job_output(h.id)), 60, "the job's first line")
    cli = _cli(fleet, "logs", "-f", h.id)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == "tick 0\ntick 1\ntick 2\n"  # the last ones printed after -f started
    assert h.get(timeout=30) == "done"


def test_gpulayer_logs_of_an_unknown_id_says_so(fleet):
    cli = _cli(fleet, "logs", "0123456789abcdef")
    assert cli.returncode == 1
    assert "unknown id 0123456789abcdef" in cli.stderr


def test_a_2x2_distributed_jobs_ranks_are_printed_rank_tagged_and_kept_per_rank(fleet, tmp_path):
    out = _run("""
        import os, gpulayer
        from gpulayer import distributed

        def ranked():
            print("hello from rank", os.environ["RANK"])
            return int(os.environ["RANK"])

        if __name__ == "__main__":
            gpulayer.init()
            job = distributed(ranked, nodes=2, procs_per_node=2)
            print("value", job.get(timeout=120))
            print("rank 3 kept", repr(job.logs(rank=3)))
            print("id", job.id)
    """, fleet, tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr
    for rank in range(4):
        assert re.search(rf"^\(rank {rank} on w-[ab]\) hello from rank {rank}$", out.stdout, re.M), out.stdout
    # each line printed before get() returned
    assert out.stdout.index("value [0, 1, 2, 3]") > out.stdout.index("hello from rank 3")
    assert "rank 3 kept 'hello from rank 3\\n'" in out.stdout
    job_id = re.search(r"^id (\S+)$", out.stdout, re.M).group(1)
    cli = _cli(fleet, "logs", job_id, "--rank", "1")
    assert cli.stdout == "hello from rank 1\n", cli.stderr
    every = _cli(fleet, "logs", job_id[:12])  # a distributed job's short id too
    assert every.returncode == 0, every.stderr
    assert every.stdout.splitlines() == [f"(rank {r}) hello from rank {r}" for r in range(4)]
    wait_until(lambda: GangStore(redis_client()).held() == {}, 30, "every slot to be free after the gang")


def test_on_output_takes_a_gangs_lines_instead_of_printing_them(fleet, capsys):
    def two_lines():
        import os
        print("a", os.environ["RANK"])
        print("b", os.environ["RANK"])

    seen = []
    job = distributed(two_lines, nodes=1, procs_per_node=2, on_output=lambda *line: seen.append(line))
    job.get(timeout=120)
    assert sorted(seen) == [(0, "stdout", "a 0"), (0, "stdout", "b 0"), (1, "stdout", "a 1"), (1, "stdout", "b 1")]
    assert "(rank" not in capsys.readouterr().out
    wait_until(lambda: GangStore(redis_client()).held() == {}, 30, "every slot to be free after the gang")


def test_lines_arrive_while_the_job_still_runs(fleet, capsys):
    def waits_after_printing(key):
        import time
        from gpulayer.app import redis_client

        print("before the wait")
        r = redis_client()
        deadline = time.monotonic() + 60
        while not r.exists(key) and time.monotonic() < deadline:
            time.sleep(0.02)
        return bool(r.exists(key))

    key = "test:output:go"
    r = redis_client()
    r.delete(key)
    h = submit.delay(waits_after_printing, key)
    seen = []

    def printed():
        seen.append(capsys.readouterr().out)
        return "before the wait" in "".join(seen)

    wait_until(printed, 30, "the job's line in this client while the job waits")
    assert not h.ready()  # it came home while the job ran, not with its result
    r.set(key, 1)
    assert h.get(timeout=30) is True
    r.delete(key)
    assert re.search(r"^\(waits_after_printing pid=\d+ on w-[abc]\) before the wait$", "".join(seen), re.M)


def test_a_cluster_fit_prints_what_a_local_fit_prints(fleet, tmp_path):
    out = _run("""
        import torch, gpulayer
        from torch.utils.data import DataLoader, TensorDataset
        from gpulayer.trainer import Trainer, Module

        class Net(Module):
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(4, 1)

            def training_step(self, batch, i):
                x, y = batch
                loss = torch.nn.functional.mse_loss(self.l(x), y)
                self.log("loss", loss)
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        def loader():
            return DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)

        if __name__ == "__main__":
            gpulayer.init()
            Trainer(num_nodes=2, devices=2, accelerator="cpu", max_epochs=2).fit(Net(), train_dataloaders=loader)
            print("fit returned")
    """, fleet, tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    # rank 0's model summary and one progress line per epoch, as a local fit prints them: untagged, before fit returns
    assert re.search(r"^\s*\| Name \| Type", text, re.M) and "Total params" in text, text
    assert re.search(r"^Epoch 0: ", text, re.M) and re.search(r"^Epoch 1: ", text, re.M), text
    assert text.index("Epoch 1: ") < text.index("fit returned")
    assert "(rank 0" not in text
    wait_until(lambda: GangStore(redis_client()).held() == {}, 30, "every slot to be free after the fit")


def test_celerys_task_logger_and_warnings_are_captured_too(fleet):
    def celery_habits():
        import warnings
        from celery.utils.log import get_task_logger

        get_task_logger("mytasks").warning("from a task logger")
        warnings.warn("careful", UserWarning)
        return 1

    h = submit.delay(celery_habits)
    assert h.get(timeout=60) == 1
    kept = h.logs().splitlines()
    assert kept[0] == "WARNING mytasks: from a task logger"  # once, though it may reach two loggers
    assert re.match(r".*: UserWarning: careful$", kept[1])  # as Python prints a warning
    assert kept.count("WARNING mytasks: from a task logger") == 1


def test_a_client_connected_to_another_cluster_gets_its_lines_from_there(fleet, fresh_fleet, capsys):
    def says(word):
        print(word)
        return word

    assert submit.delay(says, "first cluster").get(timeout=60) == "first cluster"
    fresh_fleet.add_worker("other-1", slots=1, torch=False)
    fresh_fleet.connect()
    try:
        h = submit.delay(says, "second cluster")
        assert h.get(timeout=60) == "second cluster"
        seen = []
        wait_until(lambda: seen.append(capsys.readouterr().out) or "second cluster" in "".join(seen), 30,
                   "the second cluster's line in this client")
        assert re.search(r"^\(says pid=\d+ on other-1\) second cluster$", "".join(seen), re.M)
    finally:
        fleet.connect()
