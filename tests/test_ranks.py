"""The rank runner: who failed first (from the ranks' own timestamps), and stopping every rank on it."""

from __future__ import annotations

import os
import sys

import pytest

from gpulayer.procs.env import RankLayout, free_port, rank_env
from gpulayer.gang.outcome import first_failure
from gpulayer.procs.runner import RankCommand, RankRunner
from gpulayer.procs.warm import WarmTemplate, warm_enabled

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the order of failures (pure) ------------------------------------------------------------------
def test_a_genuine_failure_beats_an_earlier_collateral_one():
    reports = [{"rank": 0, "collateral": True, "failed_at_boot": 1.0, "failed_at": 1.0, "host": "h"},
               {"rank": 3, "collateral": False, "failed_at_boot": 2.0, "failed_at": 2.0, "host": "h"}]
    assert first_failure(reports)["rank"] == 3


def test_on_one_host_the_shared_clock_decides_not_the_order_of_arrival():
    reports = [{"rank": 1, "failed_at_boot": 5.2, "failed_at": 100.0, "host": "h"},
               {"rank": 3, "failed_at_boot": 5.1, "failed_at": 101.0, "host": "h"}]  # wall clock stepped back
    assert first_failure(reports)["rank"] == 3


def test_across_hosts_wall_clocks_decide_and_untimed_reports_keep_their_order():
    reports = [{"rank": 2, "failed_at_boot": 1.0, "failed_at": 50.2, "host": "a"},
               {"rank": 0, "failed_at_boot": 900.0, "failed_at": 50.1, "host": "b"}]
    assert first_failure(reports)["rank"] == 0
    agents = [{"rank": 4, "kind": "worker_lost", "at": 7.0}, {"rank": 2, "kind": "agent", "at": 7.0}]
    assert first_failure(agents)["rank"] == 4
    assert first_failure([{"rank": 1, "collateral": True}])["rank"] == 1  # only collateral: still one is named
    with pytest.raises(ValueError):
        first_failure([])


# -- real ranks ----------------------------------------------------------------------------------------
RANK3_RAISES = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 3:
    raise ValueError("rank three has a bad shard")
dist.all_reduce(torch.ones(1))  # the others block here until they are stopped
time.sleep(120)
"""

REPORTED_RANK3 = ("from gpulayer.procs.runner import report_failure\n"
                  "import traceback, sys\n"
                  "try:\n" + "".join(f"    {line}\n" for line in RANK3_RAISES.strip().splitlines()) +
                  "except BaseException as exc:\n"
                  "    report_failure(exc, tb=traceback.format_exc())\n"
                  "    raise\n")


def _commands(code: str, world: int = 4) -> list[RankCommand]:
    port = free_port()
    base = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return [RankCommand((r,), ("-c", code), rank_env(RankLayout(0, r, 1, world), master_addr="127.0.0.1",
                                                      master_port=port, run_id="t", base_env=base))
            for r in range(world)]


@pytest.fixture(scope="module")
def template():
    if not warm_enabled():
        yield None
        return
    t = WarmTemplate(restart=False).start()
    assert t.wait_ready()
    yield t
    t.close()


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "fresh"])
def test_rank3_raises_while_the_others_block_and_the_report_names_rank3(template, warm):
    """The other ranks fail too once rank 3 is gone (gloo: connection closed): they are collateral and later."""
    if warm and template is None:
        pytest.skip("warm starts need Linux")
    first_seen = []

    def on_failure(failure):
        # called before the others are stopped (they may die on their own, not by our signal)
        first_seen.append((failure, [p.poll() for p in runner.procs]))

    runner = RankRunner(_commands(REPORTED_RANK3), template=template if warm else None, on_failure=on_failure)
    outcome = runner.run(timeout=180)
    assert outcome.state == "failed"
    assert runner.warm == [warm] * 4
    first = outcome.failures[0]
    assert (first.rank, first.kind, first.type, first.exit_code) == (3, "exception", "ValueError", 1)
    assert first.failed_at_boot and first.host
    assert "rank three has a bad shard" in first.message and "ValueError" in first.traceback
    assert len(first_seen) == 1 and first_seen[0][0].rank == 3
    assert not [c for c in first_seen[0][1] if c in (-15, -9)]  # nobody was stopped yet
    assert all(code is not None for code in outcome.exit_codes)  # every rank was reaped
    assert outcome.stopped_at is not None
    later = [f for f in outcome.failures[1:]]
    assert all(f.collateral or f.failed_at_boot >= first.failed_at_boot for f in later)


def test_a_rank_that_dies_without_a_report_is_named_with_its_exit_code(template):
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '1':\n"
            "    print('about to leave', file=sys.stderr, flush=True); os._exit(9)\n"
            "time.sleep(120)\n")
    outcome = RankRunner(_commands(code, world=2), template=template).run(timeout=120)
    assert outcome.state == "failed"
    assert [(f.rank, f.kind, f.exit_code) for f in outcome.failures] == [(1, "exit", 9)]
    assert "exit code 9" in outcome.failures[0].message
    assert outcome.failures[0].stderr_tail == "about to leave"
    assert outcome.exit_codes[1] == 9 and outcome.exit_codes[0] is not None


@pytest.mark.parametrize("own_exit", [True, False], ids=["exits-on-its-own", "stopped"])
def test_a_rank_that_ends_on_its_own_while_the_others_are_stopped_beats_a_collateral_report(template, tmp_path,
                                                                                          own_exit):
    """Rank 0 reports a lost peer while rank 1 is still exiting (its pidfd not readable yet): the stop's SIGTERM
    finds rank 1 ending with a code of its own (here: a handler's os._exit(9), as a rank already in its exit
    keeps its code), so rank 1 is the failure, ahead of the collateral report. A rank that dies of the stop's
    signal is not named."""
    ready = tmp_path / "ready"
    handler = "signal.signal(signal.SIGTERM, lambda *a: os._exit(9))\n" if own_exit else ""
    code = ("import os, signal, sys, time\n"
            "from gpulayer.procs.runner import report_failure\n"
            "if os.environ['RANK'] == '1':\n"
            f"    {handler or 'pass'}\n"
            f"    open({str(ready)!r}, 'w').close()\n"
            "else:\n"
            f"    while not os.path.exists({str(ready)!r}): time.sleep(0.01)\n"
            "    report_failure(RuntimeError('[gloo] Connection closed by peer [127.0.0.1]:1'))\n"
            "time.sleep(120)\n")
    outcome = RankRunner(_commands(code, world=2), template=template).run(timeout=120)
    assert outcome.state == "failed"
    got = [(f.rank, f.kind, f.exit_code, f.collateral) for f in outcome.failures]
    if own_exit:
        assert got == [(1, "exit", 9, False), (0, "exception", 1, True)]
        assert "exit code 9" in outcome.failures[0].message
    else:
        assert got == [(0, "exception", 1, True)]
    assert outcome.exit_codes == [-15, 9 if own_exit else -15]


def test_a_process_that_ended_with_a_code_of_its_own_during_a_stop_ended_on_its_own():
    import signal

    from gpulayer.procs.runner import ended_on_its_own

    assert ended_on_its_own(9) and ended_on_its_own(1) and ended_on_its_own(-signal.SIGSEGV)
    assert not ended_on_its_own(-signal.SIGTERM) and not ended_on_its_own(-signal.SIGKILL)  # the stop's signals
    assert not ended_on_its_own(0) and not ended_on_its_own(None)


def test_output_streams_line_by_line_and_a_stop_is_not_a_failure(template):
    lines = []
    code = "import os, sys, time\nprint('hello from', os.environ['RANK'], flush=True)\ntime.sleep(120)\n"
    runner = RankRunner(_commands(code, world=2), template=template, on_output=lambda *a: lines.append(a))
    runner.start()
    import time

    deadline = time.monotonic() + 60
    while len(lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    outcome = runner.stop(grace=1.0)
    assert outcome.state == "stopped" and outcome.failures == []
    assert sorted(lines) == [(0, "stdout", "hello from 0"), (1, "stdout", "hello from 1")]
    assert all(code is not None for code in outcome.exit_codes)


def test_run_ranks_names_rank3_while_the_others_block():
    """The local Trainer launcher uses the same runner: RankFailed names rank 3, not a collateral rank."""
    from gpulayer.trainer.errors import RankFailed
    from gpulayer.trainer.launcher import run_ranks

    with pytest.raises(RankFailed) as info:
        run_ranks(_rank3_raises, nodes=1, procs_per_node=4, timeout_s=180)
    assert info.value.rank == 3 and "rank three has a bad shard" in info.value.detail


def _rank3_raises():
    exec(RANK3_RAISES, {})


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_gloo_words_for_a_crashed_or_hung_peer_count_as_a_lost_peer():
    """gloo's message when the other side crashed (seen with torch 2.13 under load) is collateral, not the cause;
    a rank's own error is not."""
    from gpulayer.procs.runner import peer_lost

    crashed = RuntimeError("Timed out waiting 1800000ms "
                           "for recv operation to complete. This is typically caused by a remote worker crashing. "
                           "Check the logs of the remote worker before reporting an error. GLHF!")
    assert peer_lost(crashed)
    assert not peer_lost(ValueError("rank 3 raises"))


def test_a_rank_that_died_before_its_exit_was_seen_counts_as_ended_not_stopped():
    """A warm rank's exit reaches the runner through its template, late; the kernel's pidfd says it first."""
    import signal
    import subprocess

    from gpulayer.procs.runner import ended_unseen
    from gpulayer.procs.stop import stop_process

    class Late:  # its exit not seen yet, as a warm rank's before its template tells the runner
        def __init__(self, proc):
            self.proc, self.pid = proc, proc.pid

        def poll(self):
            return None

        def wait(self, timeout=None):
            return self.proc.wait(timeout)

    class Untold(Late):
        def wait(self, timeout=None):
            raise subprocess.TimeoutExpired("rank", timeout)

    dead = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.waitid(os.P_PID, dead.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: as the template would find it
        assert ended_unseen([Late(dead), Late(alive), alive]) == {0: -signal.SIGKILL}
        # Ended, but its code not told within ``wait`` (a busy template): it has ended all the same.
        assert ended_unseen([Untold(dead)], wait=0.0) == {0: None}
    finally:
        stop_process(alive)
        dead.wait()
    # A rank that lost its peer can report before the peer has finished dying: ``settle`` waits for it.
    dying = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; sys.stdin.read(); "
                              "os.kill(os.getpid(), signal.SIGKILL)"], stdin=subprocess.PIPE)
    try:
        assert ended_unseen([Late(dying)]) == {}  # still alive: nothing to wait for
        dying.stdin.close()  # now it dies
        assert ended_unseen([Late(dying)], settle=30.0) == {0: -signal.SIGKILL}
    finally:
        stop_process(dying)
