"""Errors a person can read: one line each, the remote traceback as the cause (issue 13, item 5)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import traceback

import pytest

from gpulayer import JobFailed, JobRejected, Resources, submit
from gpulayer.errors import GangFailed, RemoteTraceback
from gpulayer.store.results import as_job_failed, process_died

REMOTE_TB = 'Traceback (most recent call last):\n  File "job.py", line 3, in boom\n    raise KeyError(n)\nKeyError: 7\n'


def boom(n):
    raise KeyError(f"missing shard {n}")


def hard_exit():
    os._exit(7)


def test_job_failed_is_one_line_with_the_traceback_as_its_cause():
    err = JobFailed("KeyError", "missing\nshard 7", REMOTE_TB, job_id="j-1", worker="w-a")
    assert str(err) == "KeyError: missing shard 7 (job j-1 on w-a)"
    assert err.traceback == REMOTE_TB and err.message == "missing\nshard 7"
    assert isinstance(err.__cause__, RemoteTraceback) and err.__suppress_context__
    shown = "".join(traceback.format_exception(err))
    assert "in boom" in shown and "direct cause of the following exception" in shown
    assert shown.rstrip().splitlines()[-1] == "gpulayer.errors.JobFailed: KeyError: missing shard 7 (job j-1 on w-a)"
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.traceback == REMOTE_TB and isinstance(back.__cause__, RemoteTraceback)


def test_gang_failure_and_rejection_are_one_line():
    gang = GangFailed("ValueError", "rank 3 on w-b (127.0.0.1) failed, exit code 1: ValueError: bad shard",
                      REMOTE_TB + "\n--- last lines of rank 3's stderr ---\noops\n", job_id="g-1", worker="w-b")
    assert "\n" not in str(gang) and str(gang).startswith("distributed job g-1: rank 3 on w-b")
    assert isinstance(gang, JobFailed) and "oops" in str(gang.__cause__)
    assert "\n" not in str(JobRejected("no live worker\nin zone 'x'"))


def test_a_dead_process_is_explained_once():
    raw = "Worker exited prematurely: exitcode 7 Job: 5."
    final = process_died(raw, 3, 3)  # what the worker stores after the last delivery
    from billiard.exceptions import WorkerLostError

    for exc in (WorkerLostError(raw), WorkerLostError(final)):
        msg = as_job_failed(exc, None, "j").message
        assert msg.count("the job's process died") == 1 and msg.count("carry on") == 1, msg
        assert "exitcode 7" in msg
    assert "died on all 3 deliveries (limit 3)" in as_job_failed(WorkerLostError(final), None, "j").message


def test_remote_failure_reads_as_one_line_naming_the_job_and_worker(fleet):
    h = submit.delay(boom, 7, resources=Resources(worker_ids=["w-b"]))
    with pytest.raises(JobFailed) as e:
        h.get(timeout=60)
    err = e.value
    assert str(err) == f"KeyError: 'missing shard 7' (job {h.id} on w-b)"
    assert err.worker == "w-b" and "in boom" in err.traceback
    assert isinstance(err.__cause__, RemoteTraceback) and "in boom" in str(err.__cause__)


def test_os_exit_says_why_once(fleet):
    with pytest.raises(JobFailed) as e:
        submit.delay(hard_exit, resources=Resources(worker_ids=["w-a"])).get(timeout=120)
    msg = e.value.message
    assert "exitcode 7" in msg and msg.count("the job's process died") == 1 and msg.count("os._exit") == 1, msg
    assert "\n" not in str(e.value)


def test_rejection_is_one_line(fleet):
    with pytest.raises(JobRejected) as e:
        submit.delay(boom, 1, resources=Resources(zone="mars-1a"))
    assert "\n" not in str(e.value) and "mars-1a" in str(e.value)


def test_python_shows_the_remote_traceback_as_the_cause(fleet, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent(f"""
        import gpulayer
        from gpulayer import submit

        def explode():
            raise RuntimeError("the shard is corrupt")

        gpulayer.init({fleet.url!r}, secret={fleet.secret!r})
        submit.delay(explode).get(timeout=60)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1
    err = out.stderr
    remote, _, local = err.partition("The above exception was the direct cause of the following exception:")
    assert "in explode" in remote and "RuntimeError: the shard is corrupt" in remote, err
    last = local.rstrip().splitlines()[-1]
    assert last.startswith("gpulayer.errors.JobFailed: RuntimeError: the shard is corrupt (job "), err
    assert "Exception ignored" not in err, err


def test_the_backend_methods_overridden_keep_celerys_signatures():
    """engine/results.py overrides these Celery methods; notice when upstream changes them."""
    import inspect

    from celery.backends.asynchronous import AsyncBackendMixin
    from celery.backends.base import Backend

    assert list(inspect.signature(Backend._get_result_meta).parameters) == [
        "self", "result", "state", "traceback", "request", "format_date", "encode"]
    assert list(inspect.signature(AsyncBackendMixin.remove_pending_result).parameters) == ["self", "result"]


def test_a_traceback_names_the_users_files_and_lines_for_functions_sent_by_value(fleet, tmp_path):
    """A function from ``__main__`` (calling another one there) and one from the user's own module travel by
    value: the traceback in ``JobFailed`` and in the worker's log names their files and lines, not
    ``<dynamic-code>``."""
    (tmp_path / "shards.py").write_text(textwrap.dedent("""
        def parse(n):
            size = n * 2
            raise ValueError(f"shard {size} is corrupt")
    """))
    script = tmp_path / "prep.py"
    script.write_text(textwrap.dedent(f"""
        import gpulayer
        from gpulayer import JobFailed, Resources, submit
        from shards import parse


        def check(n):
            raise KeyError(n)


        def bad(n):
            return check(n + 1)


        gpulayer.init({fleet.url!r}, secret={fleet.secret!r})
        for fn in (bad, parse):
            try:
                submit.delay(fn, 3, resources=Resources(worker_ids=["w-b"])).get(timeout=60)
            except JobFailed as err:
                print(err.job_id)
                print(err.traceback.replace(chr(10), " | "))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    first, shown_first, second, shown_second = out.stdout.splitlines()
    log = (fleet.workdir / "w-b.log").read_text()
    for job_id, shown, frames in (
            (first, shown_first, [f'File "{script}", line 12, in bad', f'File "{script}", line 8, in check']),
            (second, shown_second, [f'File "{tmp_path / "shards.py"}", line 4, in parse'])):
        logged = log[log.index(job_id):]
        for frame in frames:
            assert frame in shown, shown
            assert frame in logged, logged[:3000]
        assert "<dynamic-code>" not in shown
