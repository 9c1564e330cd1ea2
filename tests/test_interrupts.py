"""Ctrl-C while waiting on jobs, and stopping a batch or a group (issue 13, item 4).

Each case runs a real script in a subprocess against the session fleet, sends it SIGINT
while it waits in ``get()``, then stops the jobs it left behind from here.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

import gpulayer
from gpulayer import BatchHandle, JobFailed, submit
from gpulayer.cancel import unfinished
from gpulayer.lab.fleet import wait_until
from gpulayer.store.sent import batch_members

SCRIPTS = {
    "handle": ("h = submit.delay(nap_in_child, KEY)\nids = [h.id]", "h.get()", 1, "handle.cancel()"),
    "batch": ("b = submit_batch([submit.s(nap_in_child, KEY) for _ in range(1000)])\nids = b.ids", "b.get()",
              1000, "batch.cancel()"),
    "group": ("g = group(submit.s(nap_in_child, KEY) for _ in range(200)).apply_async()\n"
              "ids = [r.id for r in g.results]", "g.get()", 200, "result.revoke()"),
}


def script_for(fleet, case: str, key: str) -> str:
    send, wait, _, _ = SCRIPTS[case]
    return textwrap.dedent(f"""
        import json, sys, threading, time
        import gpulayer
        from gpulayer import group, submit, submit_batch

        def nap_in_child(key):
            import os, subprocess
            child = subprocess.Popen(["sleep", "600"])  # a process tree to kill, not only the job's process
            gpulayer.app.redis_client().sadd(key, child.pid)
            child.wait()

        def say_when_waiting(main=threading.main_thread().ident):
            # Test scaffolding: the SIGINT must come while get() waits, not before it is called.
            while True:
                frame, names = sys._current_frames().get(main), set()
                while frame is not None:
                    names.add(frame.f_code.co_name)
                    frame = frame.f_back
                if names & {{"_gather", "wait_for_pending", "iter_native"}}:
                    print("WAITING", flush=True)
                    return
                time.sleep(0.01)

        KEY = {key!r}
        gpulayer.init({fleet.url!r}, secret={fleet.secret!r})
    """) + send + "\nprint('IDS', json.dumps(ids), flush=True)\n" + \
        "threading.Thread(target=say_when_waiting, daemon=True).start()\n" + wait + "\n"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def running_ids() -> set[str]:
    """Every job id the live workers say they are running now (Celery's inspect active)."""
    active = gpulayer.app.app.control.inspect(timeout=1.0).active() or {}
    return {job["id"] for jobs in active.values() for job in jobs}


@pytest.mark.parametrize("case", ["handle", "batch", "group"])
def test_ctrl_c_says_what_still_runs_and_cancel_stops_it(fleet, tmp_path, case):
    key = f"test:kids:{uuid.uuid4()}"
    script = tmp_path / f"wait_{case}.py"
    script.write_text(script_for(fleet, case, key))
    # Ctrl-C as a terminal sends it: SIGINT at its default in the child even if pytest runs in the background.
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    client = fleet.client()
    ids: list[str] = []
    try:
        line = proc.stdout.readline()
        assert line.startswith("IDS "), (line, proc.stderr.read() if proc.poll() is not None else "")
        ids = json.loads(line[4:])
        _, _, total, how = SCRIPTS[case]
        assert len(ids) == total
        assert proc.stdout.readline().strip() == "WAITING"
        busy = min(total, 3)  # jobs running (each with its child) while the script waits in get()
        wait_until(lambda: client.scard(key) >= busy, 60, f"{busy} jobs to start")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode != 0
        last = err.rstrip().splitlines()[-1]
        # ... and from a shell: `gpulayer cancel <the job's, batch's or group's id>`
        if total == 1:
            expected = rf"KeyboardInterrupt: stopped waiting; job {ids[0]} is still queued or running on the " \
                       rf"cluster: stop it with {re.escape(how)} or `gpulayer cancel ({ids[0]})`"
        else:
            expected = rf"KeyboardInterrupt: stopped waiting; \d+ of {total} jobs are still queued or running on " \
                       rf"the cluster: stop them with {re.escape(how)} or `gpulayer cancel ([0-9a-f-]+)`"
        said = re.fullmatch(expected, last)
        assert said, err
        if total > 1:  # the batch's or group's id finds every one of its jobs (what `gpulayer cancel` reads)
            assert batch_members(client, said[1]) == sorted(ids)
        assert "site-packages/redis" not in err and "site-packages/celery" not in err, err  # no engine frames
        assert "Exception ignored" not in err, err
        frames = re.findall(r'File "([^"]+)"', err)  # the user's script, then gpulayer's raise: nothing below it
        assert frames[0] == str(script) and all("/gpulayer/" in f for f in frames[1:]), err
        stop_and_check(case, ids, key, client)
    finally:  # whatever failed, leave no script, job or child behind for the next test
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if ids:
            BatchHandle(ids).cancel()
        for pid in (int(p) for p in client.smembers(key)):
            if alive(pid):
                psutil.Process(pid).kill()
        client.delete(key)
        client.close()


def stop_and_check(case: str, ids: list[str], key: str, client) -> None:
    total, busy = len(ids), min(len(ids), 3)
    # Stop what the script left behind, as its user would: by the handle's cancel.
    started = time.perf_counter()
    if case == "handle":
        submit.AsyncResult(ids[0]).cancel()
    elif case == "batch":
        assert BatchHandle(ids).cancel() >= busy
    else:
        assert gpulayer.app.app.GroupResult(str(uuid.uuid4()), [submit.AsyncResult(i) for i in ids]).revoke() >= busy
    took = time.perf_counter() - started
    kids = [int(p) for p in client.smembers(key)]
    wait_until(lambda: not unfinished(ids), 180, "every job of the script to be stopped or done", every=0.5)
    # Measured, not asserted: the cancel call itself, and until every job's result said so.
    print(f"{case}: cancel of {total} jobs took {took * 1000:.0f} ms; all {total} stopped "
          f"{time.perf_counter() - started:.1f}s after it")
    wait_until(lambda: not (running_ids() & set(ids)), 30, "the workers to run none of the jobs", every=0.5)
    assert not [p for p in kids if alive(p)], "a cancelled job's child process outlived the cancel"
    values = BatchHandle(ids).get(timeout=30, propagate=False)
    stopped = [v for v in values if isinstance(v, JobFailed) and v.type_name == "JobStopped"]
    assert len(stopped) == total, [str(v) for v in values if not isinstance(v, JobFailed)][:3]


def test_no_noise_at_exit_after_a_group(fleet, tmp_path):
    """A script that catches Ctrl-C in a group's get(), revokes the group and ends: nothing printed at exit."""
    script = tmp_path / "group_exit.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, threading, time
        import gpulayer
        from gpulayer import group, submit

        signal.signal(signal.SIGINT, signal.default_int_handler)
        gpulayer.init({fleet.url!r}, secret={fleet.secret!r})
        g = group(submit.s(pow, 2, i) for i in range(20)).apply_async()
        print(sum(g.get(timeout=60)))
        slow = group(submit.s(time.sleep, 5) for i in range(5)).apply_async()
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C while get() waits
        try:
            slow.get(timeout=60)
        except KeyboardInterrupt:
            print("interrupted", slow.revoke())
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(2 ** 20 - 1), "interrupted", "5"], out.stdout
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr
