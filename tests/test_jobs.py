"""Jobs against a real Redis and real worker processes."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

import gpulayer
from gpulayer import JobFailed, PayloadError, Resources, group, submit, submit_batch
from gpulayer.lab.fleet import wait_until


def square(x):
    return x * x


def where():
    return gpulayer.current_worker().id


def fail_with(message):
    raise RuntimeError(message)


def test_500_jobs_through_delay_group_and_submit_batch(fleet):
    handles = [submit.delay(square, i) for i in range(500)]
    assert [h.get(timeout=120) for h in handles] == [i * i for i in range(500)]

    g = group(submit.s(square, i) for i in range(500)).apply_async()
    assert g.get(timeout=120) == [i * i for i in range(500)]

    b = submit_batch([submit.s(square, i) for i in range(500)])
    assert len(b) == 500
    assert b.get(timeout=120) == [i * i for i in range(500)]


def test_jobs_sent_from_several_threads_at_once(fleet):
    from concurrent.futures import ThreadPoolExecutor

    def send(base):  # each thread its own delays and batches, sharing the process's connections
        singles = [submit.delay(square, base + i) for i in range(50)]
        batch = submit_batch([submit.s(square, base + 100 + i) for i in range(50)])
        return [h.get(timeout=120) for h in singles] + batch.get(timeout=120, progress=False)

    with ThreadPoolExecutor(6) as pool:
        for base, got in zip(range(0, 6000, 1000), pool.map(send, range(0, 6000, 1000))):
            assert got == [(base + i) ** 2 for i in range(50)] + [(base + 100 + i) ** 2 for i in range(50)]


def test_batch_keeps_submission_order_with_mixed_functions(fleet):
    sigs = [submit.s(square, i) if i % 2 else submit.s(lambda i: -i, i) for i in range(60)]
    assert submit_batch(sigs).get(timeout=60) == [i * i if i % 2 else -i for i in range(60)]


def test_lambda_closure_kwargs_and_reference(fleet):
    offset = 10
    assert submit.delay(lambda a, b=0: a + b + offset, 1, b=2).get(timeout=30) == 13
    assert submit.delay("math:factorial", 5).get(timeout=30) == 120
    assert submit.delay("os.path:join", "a", "b").get(timeout=30) == "a/b"


def test_main_module_function_runs_by_value(fleet, tmp_path):
    script = tmp_path / "job_script.py"
    script.write_text(textwrap.dedent(f"""
        import gpulayer
        from gpulayer import submit

        def triple(x):
            return 3 * x, __name__

        if __name__ == "__main__":
            gpulayer.init({fleet.url!r}, secret={fleet.secret!r})
            print(submit.delay(triple, 14).get(timeout=60))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # It ran on a worker, which cannot import the script: it came by value, as __main__'s function.
    assert out.stdout.strip().splitlines()[-1] == "(42, '__main__')"


def test_failure_carries_type_message_and_traceback(fleet):
    def boom(n):
        raise KeyError(f"missing shard {n}")

    h = submit.delay(boom, 7)
    with pytest.raises(JobFailed) as e:
        h.get(timeout=30)
    assert e.value.type_name == "KeyError"
    assert "missing shard 7" in e.value.message
    assert "boom" in e.value.traceback and "KeyError" in e.value.traceback
    assert e.value.job_id == h.id


def _subscribes(client) -> int:
    return int(client.info("commandstats").get("cmdstat_subscribe", {}).get("calls", 0))


def test_a_finished_job_is_read_with_one_get_and_an_unfinished_one_still_waited_for(fleet):
    import time

    def boom():
        raise ValueError("bad shard")

    done, failed = submit.delay(square, 7), submit.delay(boom)
    client = fleet.client()
    stored = [done.backend.get_key_for_task(h.id) for h in (done, failed)]  # not h.ready(): that caches the result
    deadline = time.monotonic() + 30
    while client.exists(*stored) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    before = _subscribes(client)
    assert done.get(timeout=30) == 49
    with pytest.raises(JobFailed, match="bad shard"):
        failed.get(timeout=30)
    assert failed.get(propagate=False).type_name == "ValueError"
    assert _subscribes(client) == before  # Celery's get would have subscribed to each job's channel

    slow = submit.delay(time.sleep, 1.0)  # not finished when asked: get subscribes and waits, as Celery's does
    assert slow.get(timeout=30) is None and slow.successful()
    assert _subscribes(client) > before


def test_get_finds_a_result_stored_while_it_waits_even_unannounced(fleet):
    """A waiting get subscribes on one connection and reads the stored result on another; Redis may run the read
    first, and a result stored between the two is announced before the subscription exists. The wait then reads
    the stored result again each second instead of lasting until its timeout."""
    import threading
    import time
    import uuid

    from gpulayer.app import app

    job_id = str(uuid.uuid4())
    handle = submit.AsyncResult(job_id)
    backend = app.backend

    def store_quietly():  # as a worker's store would, without the PUBLISH that announces it
        time.sleep(0.5)
        meta = {"status": "SUCCESS", "result": 42, "traceback": None, "children": [], "date_done": None,
                "task_id": job_id}
        backend.client.set(backend.get_key_for_task(job_id), backend.encode(meta))

    writer = threading.Thread(target=store_quietly)
    writer.start()
    try:
        assert handle.get(timeout=20) == 42  # Celery's get alone waits the whole 20 s, then raises TimeoutError
    finally:
        writer.join()
        backend.client.delete(backend.get_key_for_task(job_id))


def test_group_failure_is_job_failed_too(fleet):
    g = group([submit.s(square, 2), submit.s(lambda: 1 / 0)]).apply_async()
    with pytest.raises(JobFailed, match="ZeroDivisionError"):
        g.get(timeout=30)


def test_batch_failure_and_return_exceptions(fleet):
    b = submit_batch([submit.s(square, 3), submit.s(lambda: [][1])])
    with pytest.raises(JobFailed, match="IndexError"):
        b.get(timeout=30)
    values = b.get(timeout=30, propagate=False)
    assert values[0] == 9 and isinstance(values[1], JobFailed)


def test_jobs_see_their_worker(fleet):
    ids = set(submit_batch([submit.s(where) for _ in range(40)]).get(timeout=60))
    assert ids <= {"w-a", "w-b", "w-c"} and ids


def test_unpicklable_argument_is_refused_at_submission(fleet):
    import threading

    with pytest.raises(PayloadError, match="pickle"):
        submit.delay(square, threading.Lock())


def test_arguments_show_as_summaries_not_bytes(fleet):
    h = submit.delay(square, 12, resources=Resources(worker_ids=["w-a"]))  # w-a runs with --log-jobs
    h.get(timeout=30)
    log = (fleet.workdir / "w-a.log").read_text()
    mine = [line for line in log.splitlines() if h.id in line]  # other tests log refused forged bodies
    assert any("fn=square(12) resources=cpu" in line for line in mine), mine
    assert any("succeeded" in line for line in mine), mine
    assert not any("\\x80\\x05" in line for line in mine)  # no pickle protocol-5 header, i.e. no pickled bytes


def test_a_worker_logs_no_line_per_job_unless_asked(fleet):
    """Without --log-jobs (GPULAYER_LOG_JOBS), a success leaves no line in the worker's log; a failure does."""
    ok = submit.delay(square, 3, resources=Resources(worker_ids=["w-b"]))
    bad = submit.delay(fail_with, "boom", resources=Resources(worker_ids=["w-b"]))
    assert ok.get(timeout=30) == 9
    with pytest.raises(JobFailed):
        bad.get(timeout=30)
    wait_until(lambda: bad.id in (fleet.workdir / "w-b.log").read_text(), 10, "the failure's line in w-b's log")
    assert ok.id not in (fleet.workdir / "w-b.log").read_text()


def _store_once_calls(fleet, run) -> int:
    """How many times store_once.lua (a job's process storing its own result) runs while ``run()`` does."""
    import hashlib
    import threading
    from importlib import resources

    sha = hashlib.sha1(resources.files("gpulayer.store").joinpath("lua", "store_once.lua").read_bytes()).hexdigest()
    seen, ready, stop = [], threading.Event(), f"monitor-stop-{id(run)}"
    client = fleet.client()

    def watch():
        with client.monitor() as monitor:
            ready.set()
            for command in monitor.listen():
                seen.append(command["command"])
                if stop in command["command"]:
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        run()
    finally:
        fleet.client().echo(stop)
        thread.join(30)
        client.close()
    return sum(1 for c in seen if c.upper().startswith("EVALSHA") and sha in c)


def test_a_success_is_stored_by_the_worker_with_its_ack_and_a_big_one_by_its_job(fleet):
    """engine/results.py (StoreLater): a job's process hands a small success back to the worker's main process,
    which stores it in the script that acks the job (take.lua); the job's process no longer waits on Redis for it.
    A result over STORE_LATER_MAX, a failure, and a job whose chain reads it next are stored by the job itself."""
    from gpulayer.engine.results import STORE_LATER_MAX
    from gpulayer.store import keys

    ids = []

    def small():
        batch = submit_batch([submit.s(square, i) for i in range(100)])
        assert batch.get(timeout=60) == [i * i for i in range(100)]
        handles = [submit.delay(square, i) for i in range(100, 110)]
        assert [h.get(timeout=60) for h in handles] == [i * i for i in range(100, 110)]
        ids.extend([*batch.ids, *(h.id for h in handles)])

    assert _store_once_calls(fleet, small) == 0  # without StoreLater: one per job
    client = fleet.client()
    assert client.exists(*[keys.job_done(i) for i in ids]) == 110  # each marked done: a rerun is ignored
    client.close()

    def stored_by_the_job():
        assert submit.delay(str.__mul__, "x", STORE_LATER_MAX + 1).get(timeout=30) == "x" * (STORE_LATER_MAX + 1)
        with pytest.raises(JobFailed, match="ZeroDivisionError"):
            submit.delay(lambda: 1 / 0).get(timeout=30)

    assert _store_once_calls(fleet, stored_by_the_job) >= 2  # (a failure may be stored more than once)


def test_a_success_left_for_later_is_stored_first_when_a_failure_follows_it(fleet):
    """trace_storing_later with Celery's backend: a success comes back unstored (StoreLater) for the main process;
    if the same job then stores another state (a Task.on_success that raised), the success is stored at once,
    first, and stays (as when the job's process stored it before anything else)."""
    import uuid

    from celery import states

    from gpulayer.app import app
    from gpulayer.engine.results import StoreLater, trace_storing_later

    backend = app.backend
    request = type("Request", (), {"chord": None, "callbacks": None, "errbacks": None, "chain": None})()

    def succeeds(task, job_id, req):
        backend.store_result(job_id, 42, states.SUCCESS, request=request)
        return 0, "42", 0.001

    def then_fails(task, job_id, req):
        backend.store_result(job_id, 42, states.SUCCESS, request=request)
        backend.store_result(job_id, ValueError("on_success raised"), states.FAILURE, request=request)
        return 1, "einfo", 0.001

    job = str(uuid.uuid4())
    failed, summary, _ = trace_storing_later(succeeds, "t", job, {})
    assert isinstance(summary, StoreLater) and summary == "42" and not failed
    assert backend.get_task_meta(job)["status"] == states.PENDING  # not stored yet: the main process stores it
    backend.store_now(summary.store)
    assert backend.get_task_meta(job)["result"] == 42

    job = str(uuid.uuid4())
    failed, value, _ = trace_storing_later(then_fails, "t", job, {})
    assert failed and value == "einfo" and not isinstance(value, StoreLater)
    meta = backend.get_task_meta(job)
    assert meta["status"] == states.SUCCESS and meta["result"] == 42


# --- timeouts and results that cannot go back (issue 31, job API) ------------------------------------

def nap(seconds):
    import time as _t

    _t.sleep(seconds)
    return seconds


def a_lock():
    import threading

    return threading.Lock()


def test_get_keeps_to_its_timeout_and_says_what_the_job_is_doing(fleet):
    import time

    from celery.exceptions import TimeoutError as CeleryTimeoutError

    from gpulayer import JobTimeout
    from gpulayer.cancel import held_by_workers

    on_c = Resources(worker_ids=["w-c"])  # one slot: the first job runs, the second waits in w-c's queue
    first = submit.delay(nap, 60, resources=on_c)
    wait_until(lambda: held_by_workers([first.id]), 30, "w-c to take the first job")
    second = submit.delay(nap, 60, resources=on_c)
    try:
        for handle, doing in ((first, "taken by worker w-c "), (second, "queued on gl.q.w.w-c (1 job waiting there), "
                                                                         "not taken by a worker yet")):
            started = time.perf_counter()
            with pytest.raises(JobTimeout) as caught:
                handle.get(timeout=0.5)
            print(f"get(timeout=0.5) gave up after {time.perf_counter() - started:.2f} s")
            err = caught.value
            assert isinstance(err, TimeoutError) and isinstance(err, CeleryTimeoutError)  # what callers catch
            assert str(err).startswith(f"job {handle.id} did not finish within 0.5 s: {doing}"), str(err)
            assert "cancel()" in str(err) and err.job_id == handle.id and err.waited == 0.5
    finally:
        first.cancel()
        second.cancel()


def test_a_batch_that_times_out_says_how_many_finished_and_what_the_others_do(fleet):
    from gpulayer import JobTimeout
    from gpulayer.cancel import held_by_workers

    batch = submit_batch([submit.s(nap, 60) for _ in range(3)], resources=Resources(worker_ids=["w-c"]))
    try:
        wait_until(lambda: held_by_workers(batch.ids), 30, "w-c to take one job of the batch")
        with pytest.raises(JobTimeout) as caught:
            batch.get(timeout=0.3)
        text = str(caught.value)
        # w-c takes one job, or several at once ahead of its free slot (several jobs per exchange): taken or queued
        said = re.match(r"0 of 3 jobs finished within 0\.3 s; of the others, (\d) taken by workers \((\d) on w-c; "
                        r"the first [\d.]+ s ago\)(?: and (\d) queued on gl\.q\.w\.w-c \((\d) jobs? waiting there\))?; "
                        r"they run on: call get\(\) again to wait longer, or cancel\(\) to stop them$", text)
        assert said, text
        taken, on_c, queued, there = (int(n or 0) for n in said.groups())
        assert taken == on_c >= 1 and taken + queued == 3 and there == queued, text
    finally:
        batch.cancel()


def test_a_result_that_cannot_be_pickled_is_named_as_the_result(fleet):
    with pytest.raises(JobFailed) as caught:
        submit.delay(a_lock).get(timeout=30)
    message = caught.value.message
    assert message.startswith("the job's result could not be pickled: the function returned a _thread.lock, and "
                              "pickling it failed (TypeError: cannot pickle '_thread.lock' object); return plain "
                              "data instead"), message
    assert "arguments" not in message and "pass plain data" not in message


def test_a_group_that_times_out_says_how_many_finished(fleet):
    from gpulayer import JobTimeout

    result = group(submit.s(nap, 60, resources=Resources(worker_ids=["w-c"])) for _ in range(2)).apply_async()
    try:
        with pytest.raises(JobTimeout) as caught:
            result.get(timeout=0.3)
        assert str(caught.value).startswith("0 of 2 jobs finished within 0.3 s; of the others, "), str(caught.value)
        assert "w-c" in str(caught.value) or "queued" in str(caught.value), str(caught.value)
    finally:
        result.revoke()
