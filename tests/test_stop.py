"""The one stopper (gpulayer/procs/stop.py) and the one way to wait with a limit (gpulayer/deadline.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from gpulayer.deadline import Deadline, poll, wait_until
from gpulayer.procs.stop import kill_now, kill_tree, stop, stop_process


def python(code: str) -> subprocess.Popen:
    """A child running ``code``; it prints a line once it is ready (signal handlers set, children started)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    proc.ready = proc.stdout.readline().strip()
    return proc


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stop_process_asks_with_sigterm_first(tmp_path):
    marker = tmp_path / "asked"
    proc = python(f"import signal, sys, time\n"
                  f"def bye(*_):\n    open({str(marker)!r}, 'w').close(); sys.exit(0)\n"
                  f"signal.signal(signal.SIGTERM, bye); print('ready', flush=True); time.sleep(60)")
    stop_process(proc, grace=30)
    assert proc.returncode == 0 and marker.exists()


def test_what_ignores_sigterm_is_killed_after_the_grace():
    proc = python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                  "time.sleep(60)")
    stop_process(proc, grace=0.2)
    assert proc.returncode == -signal.SIGKILL


def test_without_a_first_signal_the_grace_is_only_waited():
    proc = python("import sys; print('ready', flush=True); sys.stdin.read()")  # exits once its input closes
    proc.stdin.close()
    stop([proc], 30, term=None)
    assert proc.returncode == 0


def test_kill_now_and_kill_tree_take_every_descendant():
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(c.pid, flush=True); time.sleep(60)")
    proc = python(code)
    kill_now([proc, None])
    assert proc.returncode == -signal.SIGKILL and gone(int(proc.ready))

    proc = python(code)
    assert kill_tree(proc.pid) == 2
    proc.wait()
    assert wait_until(lambda: gone(int(proc.ready)), 10, "the grandchild to be gone")


def test_deadline_without_a_limit_never_expires():
    forever = Deadline(None)
    assert not forever.expired() and forever.remaining() is None and forever.left(0.05) == 0.05
    soon = Deadline(0.0)
    time.sleep(0.001)
    assert soon.expired() and soon.remaining() == 0.0 and soon.left(0.05) == 0.0


def test_wait_until_returns_the_value_or_names_what_did_not_happen():
    values = iter([None, 0, "there"])
    assert wait_until(lambda: next(values), 30, "the value", every=0.001) == "there"
    with pytest.raises(TimeoutError, match="the impossible did not happen within 0.01 s"):
        wait_until(lambda: False, 0.01, "the impossible", every=0.001)
    assert poll(lambda: [], 0.01, every=0.001) == []
