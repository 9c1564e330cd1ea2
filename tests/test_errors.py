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
    assert last.startswith("gpulayer.errors.JobFailed[RuntimeError]: RuntimeError: the shard is corrupt (job "), err
    assert "trace_task" not in remote, err  # the engine's frames are left out of what is shown
    assert "vine" not in local and "celery" not in local, err  # and of the client's side: raised from get()
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


# -- errors keep their type (issue 40, item 3) ------------------------------------------------------------------
class CodedError(Exception):
    """An __init__ whose arguments are not its args (plain pickle cannot rebuild it)."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")
        self.code = code


class SlottedError(Exception):
    __slots__ = ("shard",)


class Reduced(Exception):
    def __init__(self, a, b):
        super().__init__(a)
        self.b = b

    def __reduce__(self):
        return Reduced, (self.args[0], self.b)


def raises_coded(code):
    raise CodedError(code, "corrupt")


def raises_slotted(shard):
    err = SlottedError("bad shard")
    err.shard = shard
    raise err


def test_a_typed_failure_masks_a_url_password_in_its_args_as_in_its_message():
    from gpulayer.remote_errors import typed

    url = "redis://:pw123456@10.0.0.1:6379/0"
    remote = RuntimeError(f"cannot reach {url}")
    remote.url = url
    err = typed(JobFailed, RuntimeError, "RuntimeError", str(remote), None, "j-1", "w-a", remote=remote)
    assert isinstance(err, RuntimeError) and err.args == ("cannot reach redis://:***@10.0.0.1:6379/0",)
    assert err.url == "redis://:***@10.0.0.1:6379/0" and err.message == err.args[0]
    for text in (repr(err), str(err), repr(err.exception), repr(pickle.loads(pickle.dumps(err)))):
        assert "pw123456" not in text and ":***@" in text


def test_a_typed_failure_is_both_and_keeps_args_attributes_and_pickles():
    from gpulayer.remote_errors import typed, typed_class

    err = typed(JobFailed, KeyError, "KeyError", "'shard 7'", REMOTE_TB, "j-1", "w-a", remote=KeyError("shard 7"))
    assert isinstance(err, JobFailed) and isinstance(err, KeyError) and type(err).__name__ == "JobFailed[KeyError]"
    assert err.args == ("shard 7",) and str(err) == "KeyError: 'shard 7' (job j-1 on w-a)"
    assert typed_class(JobFailed, KeyError) is type(err)  # made once per class
    coded = typed(JobFailed, CodedError, "CodedError", "3: bad", None, "j-2", None, remote=_rebuilt(CodedError(3, "x")))
    assert isinstance(coded, CodedError) and coded.code == 3 and coded.args == ("3: x",)
    oserr = typed(JobFailed, FileNotFoundError, "FileNotFoundError", "m", None, "j", None,
                  remote=FileNotFoundError(2, "No such file or directory", "/x"))
    assert isinstance(oserr, OSError) and (oserr.errno, oserr.filename) == (2, "/x")
    for e in (err, coded, oserr):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and back.args == e.args and str(back) == str(e)
    assert pickle.loads(pickle.dumps(coded)).code == 3
    # BaseException-only types would stop the client: plain JobFailed, naming them
    assert typed_class(JobFailed, SystemExit) is None and typed_class(JobFailed, KeyboardInterrupt) is None
    assert type(typed(JobFailed, SystemExit, "SystemExit", "3", None, "j", None)) is JobFailed
    assert typed_class(GangFailed, ValueError).__mro__[1] is GangFailed


def _rebuilt(exc):
    """``exc`` through the worker's pack and the client's unpack (remote_errors.pack / unpack)."""
    from gpulayer.remote_errors import pack, unpack

    return unpack(pack(exc))


def test_the_pack_rebuilds_odd_exceptions():
    coded = _rebuilt(CodedError(3, "bad"))
    assert type(coded) is CodedError and coded.code == 3 and coded.args == ("3: bad",)
    slotted = SlottedError("bad shard")
    slotted.shard = 4
    assert _rebuilt(slotted).shard == 4
    reduced = _rebuilt(Reduced("a", "b"))
    assert (reduced.args, reduced.b) == (("a",), "b")
    oserr = _rebuilt(FileNotFoundError(2, "No such file or directory", "/x"))
    assert (oserr.errno, oserr.strerror, oserr.filename) == (2, "No such file or directory", "/x")


def test_the_shown_traceback_leaves_out_the_engines_frames():
    import celery.app.trace

    from gpulayer.tasks import submit as submit_mod
    from gpulayer.tracebacks import shown

    text = ("Traceback (most recent call last):\n"
            f'  File "{celery.app.trace.__file__}", line 564, in trace_task\n    R = fun(*args)\n'
            f'  File "/elsewhere/site-packages/gpulayer/tasks/submit.py", line 287, in submit\n'
            "    return func(*args, **kwargs)\n           ^^^^^^^^^^^^\n"
            '  File "/home/me/celery/job.py", line 3, in boom\n    raise KeyError(n)\nKeyError: 7\n')
    assert submit_mod.__file__  # (the other machine's path is matched by the file's place in the package)
    out = shown(text)
    assert "trace_task" not in out and "in submit" not in out and "^^^" not in out
    assert 'File "/home/me/celery/job.py", line 3, in boom' in out and "KeyError: 7" in out
    assert "2 frames of celery/gpulayer left out" in out
    assert shown(REMOTE_TB) == REMOTE_TB


def test_except_the_jobs_own_type_catches_its_failure(fleet):
    pin = Resources(worker_ids=["w-b"])
    with pytest.raises(KeyError) as e:
        submit.delay(boom, 7, resources=pin).get(timeout=60)
    err = e.value
    assert isinstance(err, JobFailed) and err.args == ("missing shard 7",) and err.worker == "w-b"
    assert str(err) == f"KeyError: 'missing shard 7' (job {err.job_id} on w-b)"
    try:
        submit.delay(raises_coded, 5, resources=pin).get(timeout=60)
    except CodedError as coded:
        assert isinstance(coded, JobFailed) and coded.code == 5 and str(coded).startswith("CodedError: 5: corrupt (")
        assert "in raises_coded" in coded.traceback and "UnpickleableExceptionWrapper" not in coded.traceback
    with pytest.raises(FileNotFoundError) as missing:
        submit.delay(open, "/nonexistent/gpulayer-x", resources=pin).get(timeout=60)
    assert missing.value.errno == 2 and missing.value.filename == "/nonexistent/gpulayer-x"
    with pytest.raises(SlottedError) as slotted:
        submit.delay(raises_slotted, 9, resources=pin).get(timeout=60)
    assert slotted.value.shard == 9
    shown_tb = str(err.__cause__)
    assert "in boom" in shown_tb and "trace_task" not in shown_tb and "trace_task" in err.traceback


def test_a_chain_and_a_group_raise_the_jobs_own_type(fleet):
    from celery import chain

    from gpulayer import group

    with pytest.raises(KeyError) as e:
        chain(submit.s(pow, 2, 3), submit.s(boom)).apply_async().get(timeout=60)
    assert isinstance(e.value, JobFailed) and e.value.args == ("missing shard 8",)
    with pytest.raises(KeyError):
        group(submit.s(pow, 2, 3), submit.s(boom, 1)).apply_async().get(timeout=60)


def test_a_class_from_the_users_script_is_caught_by_its_own_name(fleet, tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(textwrap.dedent(f"""
        import gpulayer
        from gpulayer import JobFailed, submit

        class ShardMissing(Exception):
            def __init__(self, shard, where):
                super().__init__(f"shard {{shard}} missing in {{where}}")
                self.shard = shard

        def load(n):
            raise ShardMissing(n, "bucket-a")

        gpulayer.init({fleet.url!r}, secret={fleet.secret!r})
        try:
            submit.delay(load, 4).get(timeout=60)
        except ShardMissing as err:
            print(type(err).__name__, isinstance(err, JobFailed), err.shard, err)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("JobFailed[ShardMissing] True 4 ShardMissing: shard 4 missing in bucket-a (job "), \
        out.stdout


def rank_one_raises():
    import time as _t

    if os.environ["RANK"] == "1":
        raise CodedError(11, "rank one's shard")
    _t.sleep(60)  # stopped when rank 1 fails


def test_a_gang_failure_is_also_the_failed_ranks_type(fleet):
    from gpulayer import distributed

    job = distributed(rank_one_raises, nodes=1, procs_per_node=2, resources=Resources(worker_ids=["w-a"]))
    with pytest.raises(CodedError) as e:
        job.get(timeout=120)
    err = e.value
    assert isinstance(err, GangFailed) and type(err).__name__ == "GangFailed[CodedError]"
    assert err.rank == 1 and err.code == 11 and err.args == ("11: rank one's shard",)
    assert str(err).startswith(f"distributed job {job.id}: rank 1 on w-a") and "rank one's shard" in str(err)
