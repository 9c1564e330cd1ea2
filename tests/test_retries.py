"""Retries of a job whose function raised (gpulayer/retries.py, gpulayer/tasks/retry.py), and the options refused.

The pure policy is tested alone; the retries themselves on the session fleet (a real Redis, three real
workers): a try's count lives in Redis, so every try, on whichever worker, sees the ones before it.
"""

from __future__ import annotations

import inspect
import os
import random
import time

import pytest

import gpulayer
from gpulayer import JobFailed, UnsupportedOption, retries, submit, submit_batch
from gpulayer.errors import tries_text
from gpulayer.lab.fleet import wait_until
from gpulayer.tasks import options as job_options


# -- the policy, pure --------------------------------------------------------------------------------------

def test_the_options_become_a_policy_with_celerys_defaults():
    options = {"autoretry_for": (ConnectionError, TimeoutError), "queue": "q"}
    policy = retries.take(options)
    assert options == {"queue": "q"}  # taken out; the rest left for Celery
    assert policy["on"] == ["builtins.ConnectionError", "builtins.TimeoutError"]
    assert policy["max"] == 3 and policy["backoff"] == 0.0 and policy["jitter"] is True  # Celery's defaults
    assert retries.take({"queue": "q"}) is None
    assert retries.take({"autoretry_for": KeyError, "retry_backoff": True})["backoff"] == 1.0
    assert retries.take({"retry_exceptions": True, "max_retries": 5})["on"] == ["builtins.Exception"]  # Ray's
    assert retries.take({"retry_exceptions": [KeyError]})["on"] == ["builtins.KeyError"]
    assert retries.take({"autoretry_for": (KeyError,), "max_retries": None})["max"] is None  # no limit, as Celery
    assert retries.take({"autoretry_for": (KeyError,), "max_retries": 0}) is None  # no retry: no header
    assert retries.take({"autoretry_for": ()}) is None
    assert retries.take({"max_retries": 0}) is None  # none asked, none made
    assert retries.take({"retry_exceptions": True, "max_retries": -1})["max"] is None  # Ray's no limit
    celery_style = retries.take({"autoretry_for": (KeyError,), "retry_kwargs": {"max_retries": 5, "countdown": 2},
                                 "max_retries": 1})
    assert celery_style["max"] == 5 and retries.delay(celery_style, 1) == 2.0  # retry_kwargs wins, as in Celery
    assert retries.delay(retries.take({"autoretry_for": KeyError, "default_retry_delay": 3}), 2) == 3.0


@pytest.mark.parametrize("options, match", [
    ({"max_retries": 3}, r"max_retries without autoretry_for retries nothing .* autoretry_for=\(ConnectionError,\)"),
    ({"retry_backoff": True}, "these options without autoretry_for retries nothing"),
    ({"autoretry_for": (KeyError,), "retry_kwargs": {"exc": 1}}, "takes max_retries and countdown there"),
    ({"autoretry_for": (KeyError,), "default_retry_delay": -3}, "default_retry_delay=-3"),
    ({"autoretry_for": (KeyError,), "dont_autoretry_for": "KeyError"}, "dont_autoretry_for='KeyError'"),
    ({"autoretry_for": "ConnectionError"}, "give exception types"),
    ({"autoretry_for": (ConnectionError, 3)}, "3 is not an Exception type"),
    ({"autoretry_for": (KeyboardInterrupt,)}, "not an Exception type"),
    ({"autoretry_for": (KeyError,), "max_retries": -3}, "0 or more"),
    ({"autoretry_for": (KeyError,), "max_retries": 2.5}, "0 or more"),
    ({"autoretry_for": (KeyError,), "retry_backoff": -1}, "retry_backoff=-1"),
    ({"autoretry_for": (KeyError,), "retry_backoff_max": "long"}, "retry_backoff_max='long'"),
    ({"autoretry_for": (KeyError,), "retry_kwargs": {"max_retries": -2}}, "max_retries=-2"),
    ({"autoretry_for": (KeyError,), "retry_jitter": 1}, "retry_jitter=1"),
    ({"autoretry_for": (KeyError,), "retry_exceptions": True}, "give one of them"),
])
def test_bad_retry_options_are_refused_naming_the_fix(options, match):
    with pytest.raises(UnsupportedOption, match=match):
        retries.take(options)


def test_an_error_is_retried_when_a_class_of_it_is_named_and_retries_are_left():
    policy = retries.take({"autoretry_for": (ConnectionError,), "max_retries": 2})
    assert retries.applies(policy, ConnectionRefusedError("x"))  # a subclass counts
    assert not retries.applies(policy, KeyError("x"))
    once = retries.after_try(policy, "ConnectionError('x') on w-a")
    twice = retries.after_try(once, "ConnectionError('y') on w-b")
    assert retries.applies(once, ConnectionError()) and not retries.applies(twice, ConnectionError())
    assert twice["count"] == 2 and twice["tries"] == ["ConnectionError('x') on w-a", "ConnectionError('y') on w-b"]
    assert policy["tries"] == []  # each try's policy is a new one
    but = retries.take({"autoretry_for": (OSError,), "dont_autoretry_for": (FileNotFoundError,)})
    assert retries.applies(but, ConnectionError()) and not retries.applies(but, FileNotFoundError())
    from celery.exceptions import Ignore, Retry

    anything = retries.take({"retry_exceptions": True})
    assert retries.applies(anything, ValueError()) and not retries.applies(anything, Retry())
    assert not retries.applies(anything, Ignore())


def test_backoff_doubles_up_to_its_maximum_and_jitter_stays_under_it():
    plain = retries.take({"autoretry_for": (KeyError,), "retry_backoff": 2, "retry_backoff_max": 10,
                          "retry_jitter": False})
    assert [retries.delay(plain, n) for n in range(1, 6)] == [2, 4, 8, 10, 10]
    jittered = {**plain, "jitter": True}
    picks = [retries.delay(jittered, n, random.Random(n)) for n in range(1, 6)]
    assert all(0 <= p <= cap for p, cap in zip(picks, [2, 4, 8, 10, 10])) and len(set(picks)) == 5
    assert retries.delay(retries.take({"autoretry_for": (KeyError,)}), 3) == 0.0  # no backoff: at once


def test_the_final_error_names_every_try_or_the_first_and_last_ones():
    assert tries_text(["KeyError('a') on w-a", "KeyError('b') on w-b"], 2) == (
        "failed after 2 tries: try 1 KeyError('a') on w-a; try 2 KeyError('b') on w-b")
    policy = retries.take({"autoretry_for": (KeyError,), "max_retries": None})
    for n in range(1, 31):
        policy = retries.after_try(policy, f"e{n}")
    assert len(policy["tries"]) == retries.TRIES_KEPT and policy["count"] == 30
    text = tries_text(policy["tries"], policy["count"])
    assert "try 10 e10; (10 more); try 21 e21" in text and text.endswith("try 30 e30")
    assert retries.describe({"exc_type": "ConnectionError", "exc_message": ("refused",)}, "w-a") == \
        "ConnectionError('refused') on w-a"
    err = JobFailed("KeyError", "'b'", job_id="j1", worker="w-b")
    err.tries, err.try_count = ("KeyError('a') on w-a", "KeyError('b') on w-b"), 2
    assert str(err) == ("KeyError: 'b' (job j1 on w-b); failed after 2 tries: try 1 KeyError('a') on w-a; "
                        "try 2 KeyError('b') on w-b")


def test_every_option_gpulayer_lets_through_is_one_celery_or_kombu_honours():
    from celery.app.amqp import AMQP
    from celery.app.task import Task
    from celery.canvas import Signature
    from kombu import Producer

    amqp = AMQP(gpulayer.app.app)
    params = set()
    for fn in (gpulayer.app.app.send_task, AMQP.as_task_v2, amqp.send_task_message, Producer.publish,
               Task.apply_async, Signature.apply_async):
        params |= set(inspect.signature(fn).parameters)
    assert job_options.CELERY <= params  # no name let through that nothing reads
    refused_here = {"retries", "timeout", "callbacks", "errbacks", "expiration", *job_options.MOOT}
    assert refused_here <= params  # names Celery or kombu take, that gpulayer refuses (on Redis: dropped or misread)
    assert not job_options.KNOWN & refused_here


# -- on the fleet ------------------------------------------------------------------------------------------

def flaky(key, fails, error=ConnectionError):
    """Raise ``error`` on the first ``fails`` tries (counted in Redis, across workers), then return the count."""
    client = gpulayer.app.redis_client()
    client.rpush(key + ":started", time.time())
    n = client.incr(key)
    if n <= fails:
        raise error(f"try {n} refused")
    return n


def tries_of(key) -> int:
    return int(gpulayer.app.redis_client().get(key) or 0)


def started(key) -> list[float]:
    return [float(x) for x in gpulayer.app.redis_client().lrange(key + ":started", 0, -1)]


def test_a_job_that_fails_twice_then_succeeds_returns_its_value(fleet):
    key = f"retry:{os.urandom(6).hex()}"
    h = submit.apply_async((flaky, key, 2), max_retries=3, autoretry_for=(ConnectionError,))
    assert h.get(timeout=60) == 3
    retried = [e for e in h.history() if e["event"] == "retried"]
    assert [e["attempt"] for e in retried] == [1, 2] and h.attempts == 3
    assert retried[0]["error"].startswith("ConnectionError('try 1 refused') on w-")


def test_with_one_retry_it_fails_naming_both_tries(fleet):
    key = f"retry:{os.urandom(6).hex()}"
    h = submit.apply_async((flaky, key, 2), max_retries=1, autoretry_for=(ConnectionError,))
    with pytest.raises(JobFailed) as e:
        h.get(timeout=60)
    assert tries_of(key) == 2  # ran twice, not three times
    text = str(e.value)
    assert "ConnectionError: try 2 refused" in text and "failed after 2 tries: " in text
    assert "try 1 ConnectionError('try 1 refused') on w-" in text
    assert "try 2 ConnectionError('try 2 refused') on w-" in text
    assert e.value.try_count == 2 and len(e.value.tries) == 2


def test_each_try_goes_where_the_job_may_run(fleet):
    key = f"retry:{os.urandom(6).hex()}"
    h = submit.apply_async((flaky, key, 2), {"resources": gpulayer.Resources(zone="us-central1-a")},
                           max_retries=2, autoretry_for=(ConnectionError,))
    assert h.get(timeout=60) == 3
    assert [e["worker"] for e in h.history() if e["event"] == "retried"] == ["w-c", "w-c"]  # the zone's only one


def test_only_the_named_errors_are_retried_and_their_subclasses(fleet):
    key = f"retry:{os.urandom(6).hex()}"
    h = submit.apply_async((flaky, key, 1, KeyError), max_retries=3, autoretry_for=(ConnectionError,))
    with pytest.raises(JobFailed, match="KeyError") as e:
        h.get(timeout=60)
    assert tries_of(key) == 1 and e.value.try_count == 1 and "failed after" not in str(e.value)
    key = f"retry:{os.urandom(6).hex()}"
    assert submit.apply_async((flaky, key, 2, ConnectionRefusedError), autoretry_for=(OSError,)).get(timeout=60) == 3


def test_retry_options_on_a_signature_and_in_a_chain(fleet):
    key = f"retry:{os.urandom(6).hex()}"
    sig = submit.s(flaky, key, 1).set(max_retries=2, autoretry_for=(ConnectionError,))
    assert sig.delay().get(timeout=60) == 2
    key = f"retry:{os.urandom(6).hex()}"
    chained = submit.s(flaky, key, 0) | submit.s(lambda n, k: flaky(k, n + 1) * 10, key).set(
        retry_exceptions=True, max_retries=2)  # Ray's spelling; the second step fails once
    assert chained.apply_async().get(timeout=60) == 30
    key = f"retry:{os.urandom(6).hex()}"
    first_retries = submit.s(flaky, key, 1).set(max_retries=2, autoretry_for=(ConnectionError,)) | submit.s(
        lambda n: n * 100)  # the chain's next step goes with the retried first one
    assert first_retries.apply_async().get(timeout=60) == 200


def test_a_groups_options_reach_each_of_its_jobs(fleet):
    from celery import group

    base = f"retry:{os.urandom(6).hex()}"
    g = group(submit.s(flaky, f"{base}:{i}", 1) for i in range(3)).apply_async(
        max_retries=2, autoretry_for=(ConnectionError,))
    assert g.get(timeout=60) == [2, 2, 2]
    from celery import chord

    header = [submit.s(flaky, f"{base}:c{i}", 1).set(max_retries=1, autoretry_for=(ConnectionError,))
              for i in range(3)]
    assert chord(header, submit.s(sum)).apply_async().get(timeout=60) == 6  # the body waits for the last tries


def retries_itself(key, until, max_retries=None):
    """Celery's habit: ``self.retry()`` inside the task (here the running job's ``current_task``)."""
    from celery import current_task

    n = gpulayer.app.redis_client().incr(key)
    if n < until:
        try:
            raise ValueError(f"not yet ({n})")
        except ValueError as err:
            raise current_task.retry(exc=err, countdown=0.1, max_retries=max_retries)
    return n


def test_celerys_self_retry_inside_a_job(fleet):
    key = f"retry:{os.urandom(6).hex()}"
    assert submit.delay(retries_itself, key, 3).get(timeout=60) == 3
    key = f"retry:{os.urandom(6).hex()}"
    with pytest.raises(JobFailed, match=r"ValueError: not yet \(2\) .*failed after 2 tries: try 1 ValueError"):
        submit.delay(retries_itself, key, 5, max_retries=1).get(timeout=60)
    assert tries_of(key) == 2
    h = submit.delay(retries_itself, f"retry:{os.urandom(6).hex()}", 2)
    assert h.get(timeout=60) == 2 and [e["attempt"] for e in h.history() if e["event"] == "retried"] == [1]


def test_retries_in_a_batch_and_a_signature_of_its_own(fleet):
    base = f"retry:{os.urandom(6).hex()}"
    sigs = [submit.s(flaky, f"{base}:{i}", 1) for i in range(10)]
    sigs[3] = sigs[3].set(max_retries=0, autoretry_for=(ConnectionError,))  # this one is not retried
    batch = submit_batch(sigs, max_retries=2, autoretry_for=(ConnectionError,))
    got = batch.get(timeout=120, propagate=False)
    assert [g for i, g in enumerate(got) if i != 3] == [2] * 9
    assert isinstance(got[3], JobFailed) and tries_of(f"{base}:3") == 1
    with pytest.raises(UnsupportedOption, match="did you mean max_retries"):
        submit_batch([submit.s(flaky, base, 0)], retries=2)
    with pytest.raises(UnsupportedOption, match="countdown=1 on a signature given to submit_batch"):
        submit_batch([submit.s(flaky, base, 0).set(countdown=1)])


def test_backoff_holds_each_try_back_longer(fleet):
    key = f"retry:{os.urandom(6).hex()}"
    h = submit.apply_async((flaky, key, 3), max_retries=3, autoretry_for=(ConnectionError,), retry_backoff=0.3,
                           retry_jitter=False)
    seen = []  # the stored meta, once it says RETRY (read in one go: the job moves on meanwhile)
    wait_until(lambda: seen.append(h.backend.get_task_meta(h.id)) or seen[-1]["status"] == "RETRY", 30,
               "the job to show RETRY while it waits for its next try")
    tries = seen[-1]["tries"]
    assert tries["total"] >= 1 and tries["outcomes"][0].startswith("ConnectionError('try 1 refused') on w-")
    assert h.get(timeout=60) == 4
    retried = [e for e in h.history() if e["event"] == "retried"]
    assert [(e["attempt"], e["delay"]) for e in retried] == [(1, 0.3), (2, 0.6), (3, 1.2)]
    starts = started(key)
    assert len(starts) == 4
    for before, after, e in zip(starts, starts[1:], retried):  # a try never starts before its countdown is over
        assert after - before >= e["delay"] - 0.01, (starts, retried)


def test_a_job_cancelled_while_it_waits_for_its_next_try_runs_no_more(fleet):
    key = f"retry:{os.urandom(6).hex()}"
    h = submit.apply_async((flaky, key, 5), max_retries=5, autoretry_for=(ConnectionError,), retry_backoff=4,
                           retry_jitter=False)
    wait_until(lambda: h.state == "RETRY", 30, "the job to wait for its second try")
    with pytest.raises(gpulayer.JobTimeout, match=r"try 1 raised ConnectionError\('try 1 refused'\) on w-.; try 2: "):
        h.get(timeout=0.2)
    h.cancel()
    with pytest.raises(JobFailed, match="cancelled"):
        h.get(timeout=60)
    assert tries_of(key) == 1  # its next try was dropped when it came due


def test_a_dead_delivery_is_not_a_try(fleet):
    key = f"retry:{os.urandom(6).hex()}"

    def dies_once(key):
        if gpulayer.app.redis_client().incr(key) == 1:
            os._exit(1)  # the pool process dies: the delivery goes back to its queue, as every job's does
        return "survived"

    h = submit.apply_async((dies_once, key), max_retries=3, retry_exceptions=True)
    assert h.get(timeout=120) == "survived"
    assert [e["event"] for e in h.history() if e["event"] in ("lost", "retried")] == ["lost"]


def test_a_job_over_its_timeout_is_stopped_not_retried(fleet):
    h = submit.apply_async((time.sleep, 30), {"timeout": 0.5}, max_retries=2, retry_exceptions=True)
    with pytest.raises(JobFailed, match="JobStopped") as e:
        h.get(timeout=60)
    assert e.value.try_count == 1 and not [x for x in h.history() if x["event"] == "retried"]


@pytest.mark.parametrize("option, match", [
    ({"retries": 3}, r"retries=3 is not an option gpulayer honours.*did you mean max_retries"),
    ({"max_retry": 3}, "did you mean max_retries"),
    ({"autoretry": (KeyError,)}, "did you mean autoretry_for"),
    ({"timeout": 5}, r"did you mean the job's timeout, given with its arguments"),
    ({"resources": {"cuda": True}}, "did you mean resources given with the job's arguments"),
    ({"mandatory": True}, "AMQP flag"),
    ({"frobnicate": 1}, r"frobnicate=1 .* drop frobnicate="),
    ({"max_retries": 3}, "without autoretry_for retries nothing"),
])
def test_options_gpulayer_does_not_honour_are_refused(fleet, option, match):
    with pytest.raises(UnsupportedOption, match=match):
        submit.apply_async((flaky, "unused", 0), **option)
    with pytest.raises(UnsupportedOption, match=match):
        submit.s(flaky, "unused", 0).set(**option).delay()


def test_flower_sees_each_try_through_celerys_events(fleet):
    from .test_events import decode_events, enable_events

    enable_events(len(fleet.workers))
    client = fleet.client()
    pubsub = client.pubsub()
    pubsub.psubscribe("*celeryev*")
    try:
        assert pubsub.get_message(timeout=5)["type"] == "psubscribe"
        key = f"retry:{os.urandom(6).hex()}"
        h = submit.apply_async((flaky, key, 1), max_retries=2, autoretry_for=(ConnectionError,))
        assert h.get(timeout=60) == 2
        seen: list[dict] = []
        wait_until(lambda: _events_of(pubsub, h.id, seen, decode_events) and
                   {"task-retried", "task-succeeded"} <= {e["type"] for e in seen}, 30,
                   "the job's task-retried and task-succeeded events")
    finally:
        pubsub.close()
        client.close()
    retried = next(e for e in seen if e["type"] == "task-retried")
    assert "ConnectionError('try 1 refused')" in retried["exception"]
    received = sorted(e.get("retries") for e in seen if e["type"] == "task-received")  # (two workers' flushes)
    assert received == [0, 1]  # Flower's "Retries" column, from each try's message


def _events_of(pubsub, job_id, seen: list, decode) -> bool:
    message = pubsub.get_message(timeout=1)
    while message is not None:
        if message["type"] == "pmessage":
            seen.extend(e for e in decode(message["data"]) if e.get("uuid") == job_id)
        message = pubsub.get_message(timeout=0.05)
    return True
