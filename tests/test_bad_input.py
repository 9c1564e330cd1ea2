"""Every public entry point answers bad input with an error that names the problem (docs/REFERENCE.md, "Bad input, and what you get")."""

from __future__ import annotations

import threading

import pytest

import gpulayer
from gpulayer import (ClusterUnavailable, ConfigError, InvalidRequest, JobFailed, JobRejected, PayloadError, Resources,
                      distributed, signing, submit, submit_batch)
from gpulayer.procs.env import free_port


def square(x):
    return x * x


def test_unpicklable_function(fleet):
    lock = threading.Lock()
    with pytest.raises(PayloadError, match="cannot pickle function") as e:
        submit.delay(lambda: lock.locked())
    assert "create that object inside the function" in str(e.value)


def test_unpicklable_argument(fleet):
    with pytest.raises(PayloadError, match="cannot pickle the job's payload"):
        submit.delay(square, threading.Lock())


def test_payload_over_the_size_limit(fleet):
    signing.configure(signing.current_secret(), 4096)
    try:
        with pytest.raises(PayloadError, match=r"over the 0 MiB limit|MiB limit"):
            submit.delay(square, b"x" * 10_000)
        with pytest.raises(PayloadError, match="GPULAYER_MAX_PAYLOAD_BYTES"):
            submit_batch([submit.s(square, b"x" * 10_000)])
    finally:
        signing.configure(signing.current_secret(), 64 * 2**20)


def test_unknown_resources_field(fleet):
    with pytest.raises(InvalidRequest, match=r"^Resources\(gpu=1\): no field 'gpu'; did you mean gpus\? \(fields: cuda, "
                                             r"gpus, zone, region, worker_ids\)$"):
        submit.delay(square, 2, resources={"gpu": 1})
    with pytest.raises(TypeError, match="resources must be"):
        submit.delay(square, 2, resources="cuda")


def test_negative_or_zero_counts(fleet):
    with pytest.raises(InvalidRequest, match=r"^Resources\(gpus=-1\): gpus must be at least 0$"):
        Resources(gpus=-1)
    with pytest.raises(InvalidRequest, match=r"^distributed\(procs_per_node=0\): procs_per_node must be at least 1$"):
        distributed(square, 1, nodes=1, procs_per_node=0)
    with pytest.raises(InvalidRequest, match=r"^submit\(timeout=0\): timeout must be a positive"):
        submit.delay(square, 1, timeout=0)


def test_unknown_zone_or_worker(fleet):
    with pytest.raises(JobRejected, match="zone 'mars-1a'"):
        submit.delay(square, 1, resources=Resources(zone="mars-1a"))
    with pytest.raises(JobRejected, match="no live worker named 'nobody'"):
        submit.delay(square, 1, resources=Resources(worker_ids=["nobody"]))


def test_missing_function_reference(fleet):
    with pytest.raises(PayloadError, match="package.module:function"):
        submit.delay("math.sqrt", 4)
    with pytest.raises(JobFailed, match="cannot load 'math:nope' on this worker"):
        submit.delay("math:nope", 4).get(timeout=60)


@pytest.mark.timeout(30)
def test_unreachable_redis_fails_fast_not_a_hang(gpulayer_home):
    port = free_port()  # nothing listens there
    with pytest.raises(ClusterUnavailable, match=f"cannot reach Redis at 127.0.0.1:{port}"):
        gpulayer.connect(gpulayer.config.load_settings(broker_url=f"redis://127.0.0.1:{port}/0", secret="s"))


def test_wrong_password(fleet, gpulayer_home):
    bad = fleet.url.replace(fleet.password, "wrong")
    with pytest.raises(ClusterUnavailable, match="refused the password"):
        gpulayer.connect(gpulayer.config.load_settings(broker_url=bad, secret="s"))
    nopw = fleet.url.replace(f":{fleet.password}@", "")
    with pytest.raises(ClusterUnavailable, match="needs a password"):
        gpulayer.connect(gpulayer.config.load_settings(broker_url=nopw, secret="s"))


def test_missing_secret(gpulayer_home, fleet):
    with pytest.raises(ConfigError, match="GPULAYER_SECRET"):
        gpulayer.connect(gpulayer.config.load_settings(broker_url=fleet.url))


def unpicklable_result():
    import threading as _th

    return _th.Lock()


class Weird(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()


def unpicklable_exception():
    raise Weird("shard 9 is corrupt")


def test_result_that_cannot_be_pickled(fleet):
    with pytest.raises(JobFailed) as e:
        submit.delay(unpicklable_result).get(timeout=60)
    assert "pickle" in str(e.value).lower() and "lock" in str(e.value).lower()


def test_exception_that_cannot_be_pickled(fleet):
    with pytest.raises(JobFailed) as e:
        submit.delay(unpicklable_exception).get(timeout=60)
    assert e.value.type_name == "Weird" and "shard 9 is corrupt" in e.value.message


def where_am_i():
    return gpulayer.current_worker().id


def test_unknown_queue_is_refused_naming_the_queues_that_exist(fleet):
    with pytest.raises(JobRejected) as e:
        submit.apply_async((square, 2), queue="celery")
    msg = str(e.value)
    assert "no live worker reads queue 'celery'" in msg and "drop queue=" in msg
    assert "gl.q.cpu" in msg and "gl.q.cpu.z.europe-west1-b" in msg and "gl.q.cpu.r.us-central1" in msg
    assert "gl.q.w.<worker id> (w-a, w-b, w-c)" in msg and "\n" not in msg
    with pytest.raises(JobRejected, match=r"did you mean 'gl.q.cpu.z.us-central1-a'"):
        submit.apply_async((square, 2), queue="gl.q.cpu.z.us-central1-b")


def test_a_queue_live_workers_read_is_honoured(fleet):
    from gpulayer import queues

    assert submit.apply_async((where_am_i,), queue=queues.capability(zone="us-central1-a")).get(timeout=60) == "w-c"
    assert submit.apply_async((where_am_i,), queue=queues.private("w-b")).get(timeout=60) == "w-b"
    with pytest.raises(JobRejected, match=r"queue 'gl.q.w.w-c' is read by w-c, but .*zone 'europe-west1-b'"):
        submit.apply_async((where_am_i,), {"resources": Resources(zone="europe-west1-b")}, queue=queues.private("w-c"))


def test_options_the_broker_cannot_honour_are_refused(fleet):
    from gpulayer.errors import UnsupportedOption

    assert submit.apply_async((square, 4), priority=9).get(timeout=60) == 16  # a step Redis keeps: honoured
    for bad in (5, 42, "high"):
        with pytest.raises(UnsupportedOption, match=r"priorities 0, 3, 6, 9 \(higher runs first\)"):
            submit.apply_async((square, 4), priority=bad)
    with pytest.raises(UnsupportedOption, match="signed serializer"):
        submit.apply_async((square, 4), serializer="json")
    with pytest.raises(UnsupportedOption, match="routing_key='elsewhere'"):
        submit.apply_async((square, 4), routing_key="elsewhere")


def test_celery_timing_options_are_honoured(fleet):
    assert submit.apply_async((square, 3), countdown=1.0).get(timeout=60) == 9
    with pytest.raises(JobFailed, match="cancelled before it ran"):  # expired while queued: never runs
        submit.apply_async((square, 3), expires=0.001, queue=gpulayer.queues.private("w-c"),
                           countdown=0.5).get(timeout=60)


def test_a_bad_resources_field_in_a_script_shows_one_line_naming_the_field_and_the_rule(tmp_path):
    import subprocess
    import sys

    for code, said in (("Resources(gpus=-1)", "InvalidRequest: Resources(gpus=-1): gpus must be at least 0"),
                       ("Resources(zoen='europe-west1-b')", "InvalidRequest: Resources(zoen='europe-west1-b'): no "
                                                            "field 'zoen'; did you mean zone?")):
        out = subprocess.run([sys.executable, "-c", f"from gpulayer import Resources\n{code}"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 1
        assert said in out.stderr.splitlines()[-1], out.stderr
        assert "pydantic" not in out.stderr and "validation error" not in out.stderr, out.stderr
    import gpulayer

    assert issubclass(gpulayer.InvalidRequest, (gpulayer.GpulayerError, ValueError))
