"""Warm starts: a rank forked from the template must look like a fresh interpreter to user code.

Each hygiene test reads what two ranks saw (``tests/warm_driver.py``), started
three ways from a driver process made deliberately unlike a fresh one: forked
from the warm template (must be right), fresh interpreters (the reference,
must be right), and a naive ``os.fork()`` of the driver (must be wrong: the
check can fail, and would fail if the runner simply forked).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from gpulayer.procs.runner import RankCommand, RankRunner
from gpulayer.procs.warm import WarmTemplate, warm_enabled

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "warm_driver.py")
REPO = os.path.dirname(HERE)
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                 "OMP_NUM_THREADS")

pytestmark = pytest.mark.skipif(not warm_enabled(), reason="warm starts need Linux (os.pidfd_open, send_fds)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GPULAYER_WARM_RANKS"}
    env["PYTHONPATH"] = os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """{mode: (summary, [facts of rank 0, facts of rank 1])} for warm, fresh and naive."""
    out = {}
    for mode in ("warm", "fresh", "naive"):
        folder = tmp_path_factory.mktemp(mode)
        # stdin is a pipe here, so a rank that inherited it (naive) is told apart from one on /dev/null
        proc = subprocess.run([sys.executable, DRIVER, "drive", mode, str(folder)], env=_env(),
                              stdin=subprocess.PIPE, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{mode} driver failed:\n{proc.stdout}\n{proc.stderr}"
        summary = json.loads((folder / f"{mode}-summary.json").read_text())
        facts = [json.loads((folder / f"{mode}-{r}.json").read_text()) for r in range(2)]
        summary["folder"] = str(folder)
        out[mode] = (summary, facts)
    warm_summary, _ = out["warm"]
    assert warm_summary["warm"] == [True, True], "the ranks were not forked from the template"
    assert out["fresh"][0]["warm"] == [False, False]
    return out


def _check(seen, fact) -> None:
    """``fact(summary, ranks)`` holds for warm and fresh ranks and fails for naively forked ones."""
    for mode in ("warm", "fresh"):
        summary, ranks = seen[mode]
        assert fact(summary, ranks), f"{mode} ranks: {fact.__doc__}"
    summary, ranks = seen["naive"]
    assert not fact(summary, ranks), f"the check cannot fail (a naive fork passes it): {fact.__doc__}"


def test_each_rank_has_its_own_environment_wholesale(seen):
    """A naive fork keeps the parent's os.environ: a variable only the parent has, none of torchrun's."""

    def fact(summary, ranks):
        """os.environ is the rank's own: every torchrun variable as given, nothing only the parent had"""
        return all(r["env"].get("WARM_TEST_PARENT_ONLY") is None and r["env"].get("WARM_TEST_RANK_ONLY") == str(i)
                   and all(v in r["env"] for v in TORCHRUN_VARS) and r["env"]["RANK"] == str(i)
                   for i, r in enumerate(ranks))

    _check(seen, fact)


def test_omp_num_threads_is_what_torch_uses(seen):
    """torch reads OMP_NUM_THREADS once, at import: a naive fork keeps the parent's thread count (3 here)."""

    def fact(summary, ranks):
        """torch.get_num_threads() is the rank's OMP_NUM_THREADS (1 and 2)"""
        return [r["threads"] for r in ranks] == [1, 2]

    _check(seen, fact)


def test_random_generators_are_fresh_in_every_rank(seen):
    """A naive fork copies NumPy's and torch's generator state: both ranks draw the same numbers."""

    def fact(summary, ranks):
        """random, NumPy and torch draw different numbers in each rank, and not the parent's seed-0 stream"""
        import numpy as np
        import torch

        np.random.seed(0)
        torch.manual_seed(0)
        seeded = [float(np.random.random()), float(torch.rand(1).item())]
        a, b = ranks[0]["random"], ranks[1]["random"]
        return all(x != y for x, y in zip(a, b)) and all(r["random"][1:] != seeded for r in ranks)

    _check(seen, fact)


def test_each_rank_has_its_own_process_group_and_pid(seen):
    """A naive fork stays in the parent's process group: a stop of the rank's group would hit the parent."""

    def fact(summary, ranks):
        """each rank leads its own session and process group; pids differ from each other and the driver"""
        driver = summary["driver"]
        return all(r["pgid"] == r["pid"] == r["sid"] and r["pgid"] != driver["pgid"] for r in ranks) and \
            len({r["pid"] for r in ranks} | {driver["pid"]}) == 3

    _check(seen, fact)


def test_stdin_is_closed(seen):
    """A naive fork shares the parent's stdin (a pipe here): a rank that reads it steals the parent's input."""

    def fact(summary, ranks):
        """stdin is /dev/null"""
        return all(r["stdin_is_devnull"] for r in ranks)

    _check(seen, fact)


def test_argv_and_main_are_the_scripts_as_torchrun_gives_them(seen):
    """A naive fork keeps the parent's sys.argv and __main__ (the driver), not the rank's script."""

    def fact(summary, ranks):
        """sys.argv is [script, args...], __main__ is the script, sys.path[0] its folder, cwd as asked"""
        return all(r["argv"] == [DRIVER, "probe", r["argv"][2], f"arg{i}"] and r["main_file"] == DRIVER
                   and r["main_name"] == "__main__" and r["path0"] == HERE
                   and r["cwd"] == os.path.join(summary["folder"], "rank") for i, r in enumerate(ranks))

    _check(seen, fact)


def test_ps_shows_each_ranks_own_command_line(seen):
    """A naive fork shows the parent's command line in /proc/<pid>/cmdline (ps, psutil, failstop's leak check)."""

    def fact(summary, ranks):
        """/proc/self/cmdline is the rank's python command line"""
        return all(r["cmdline"][:3] == [r["executable"], DRIVER, "probe"] and r["cmdline"][-1] == f"arg{i}"
                   and len(r["cmdline"]) == 5 for i, r in enumerate(ranks))

    _check(seen, fact)


def test_signal_handlers_are_a_fresh_interpreters(seen):
    """A naive fork keeps the parent's handlers (SIGTERM caught: the runner's stop would not stop the rank)."""

    def fact(summary, ranks):
        """SIGUSR1 and SIGTERM default, SIGINT raises KeyboardInterrupt, SIGPIPE ignored, as in a fresh python"""
        return all(r["signals"] == {"SIGUSR1": "SIG_DFL", "SIGTERM": "SIG_DFL", "SIGINT": "default_int_handler",
                                    "SIGPIPE": "SIG_IGN"} for r in ranks)

    _check(seen, fact)


def test_no_signal_stays_blocked(seen):
    """A naive fork inherits the parent's signal mask (SIGUSR2 blocked here); a fork server must clear it."""
    summary, ranks = seen["warm"]
    assert all(r["blocked"] == [] for r in ranks)
    summary, ranks = seen["naive"]
    assert all(int(signal.SIGUSR2) in r["blocked"] for r in ranks), "the check cannot fail"


def test_the_parent_death_signal_is_set(seen):
    """A naive fork has no parent-death signal: a rank outlives a worker that was SIGKILLed."""

    def fact(summary, ranks):
        """each rank gets SIGKILL when its parent dies (PR_SET_PDEATHSIG)"""
        return all(r["pdeathsig"] == int(signal.SIGKILL) for r in ranks)

    _check(seen, fact)


def test_a_rank_dies_with_a_runner_that_is_sigkilled(tmp_path):
    """A naive fork server's rank would be adopted by init and keep running after its runner is SIGKILLed."""
    code = (
        "import sys, os\n"
        "from gpulayer.procs.runner import RankCommand, RankRunner\n"
        "from gpulayer.procs.warm import WarmTemplate\n"
        "t = WarmTemplate(restart=False).start()\n"
        "r = RankRunner([RankCommand((0,), ('-c', 'import os, time; print(os.getpid(), flush=True); "
        "time.sleep(300)'), dict(os.environ))], template=t, on_output=lambda rank, s, l: os.write(1, f'{l}\\n'.encode()))\n"
        "r.start()\n"
        "os.write(1, f'warm {r.warm[0]} {t.pid}\\n'.encode())  # one write a line: print() from two threads can interleave\n"
        "r.wait()\n")
    runner = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True)
    rank_pid = template_pid = None
    try:
        first, second = runner.stdout.readline().split(), runner.stdout.readline().split()
        lines = sorted([first, second], key=len)
        rank_pid = int(lines[0][0])
        assert lines[1][:2] == ["warm", "True"]
        template_pid = int(lines[1][2])
        assert psutil.pid_exists(rank_pid)
        runner.kill()
        runner.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_alive(rank_pid) or _alive(template_pid)):
            time.sleep(0.02)
        assert not _alive(rank_pid), "the rank outlived its runner"
        assert not _alive(template_pid), "the template outlived its runner"
    finally:
        for pid in (rank_pid, template_pid):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if runner.poll() is None:
            runner.kill()
            runner.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_exit_codes_come_back_and_no_zombie_is_left():
    """A forked rank is not the runner's child: a naive fork server that forgets its children leaves zombies,
    and the runner could not learn their exit codes (waitpid works only for one's own children)."""
    template = WarmTemplate(restart=False).start()
    try:
        assert template.wait_ready()
        codes = ["pass", "import sys; sys.exit(7)", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                 "raise ValueError('x')"]
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            procs = [template.spawn(["-c", c], _env(), None, null, null) for c in codes]
        finally:
            os.close(null)
        assert [p.wait(60) for p in procs] == [0, 7, -signal.SIGKILL, 1]
        children = psutil.Process(template.pid).children()
        assert not [c for c in children if c.status() == psutil.STATUS_ZOMBIE]
    finally:
        template.close()


def test_a_preloaded_module_runs_with_m_as_quietly_as_in_a_fresh_interpreter(tmp_path):
    """``-m gpulayer.gang.rank`` is preloaded in the template: a naive ``runpy.run_module`` of it prints
    runpy's "found in sys.modules ... unpredictable behaviour" RuntimeWarning on every rank's stderr."""
    template = WarmTemplate(restart=False).start()
    try:
        assert template.wait_ready()
        err = tmp_path / "stderr"
        null = os.open(os.devnull, os.O_WRONLY)
        fd = os.open(err, os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # the rank module without its arguments: it fails at once, after runpy has had its say
            proc = template.spawn(["-m", "gpulayer.gang.rank"], _env(), None, null, fd)
        finally:
            os.close(null)
            os.close(fd)
        proc.wait(60)
        assert "RuntimeWarning" not in err.read_text()
        assert "found in sys.modules" not in err.read_text()
    finally:
        template.close()


def test_the_template_is_restarted_when_it_dies():
    template = WarmTemplate().start()
    try:
        assert template.wait_ready()
        first = template.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (template.ready and template.pid != first):
            time.sleep(0.05)
        assert template.pid != first and template.ready
        runner = RankRunner([RankCommand((0,), ("-c", "print('again')"), _env())], template=template,
                            on_output=lambda r, s, line: lines.append(line))
        lines: list[str] = []
        assert runner.run(timeout=60).state == "succeeded" and runner.warm == [True]
        assert lines == ["again"]
    finally:
        template.close()


def test_warm_starts_can_be_turned_off(monkeypatch):
    from gpulayer.procs import warm

    monkeypatch.setenv("GPULAYER_WARM_RANKS", "0")
    assert not warm.warm_enabled()
    assert warm.shared_template() is None
