"""Celery's canvas with ``submit`` signatures, against real workers: each form passes the previous result on."""

from __future__ import annotations

import pytest
from celery import chain, chord, group

import gpulayer
from gpulayer import JobFailed, PayloadError, Resources, submit, submit_batch
from gpulayer import signing
from gpulayer.canvas import FUNCTION_OPTION
from gpulayer.payload import PickledFunction


def add(x, y):
    return x + y


def sub(x, y):
    return x - y


def double(x):
    return 2 * x


def total(xs):
    return sum(xs)


def tagged(x):
    """The value and the worker this step ran on."""
    return [x, gpulayer.current_worker().id]


def then_tagged(pair):
    return pair + [pair[0] * 10, gpulayer.current_worker().id]


def boom(x):
    raise ValueError(f"boom {x}")


def failed_id(task_id):
    """An errback: Celery passes it the id of the job that failed."""
    return ["errback", task_id]


def _stored_raw(fleet, job_id: str) -> bytes:
    client = fleet.client()
    try:
        return client.get(gpulayer.app.app.backend.get_key_for_task(job_id))
    finally:
        client.close()


def test_signature_keeps_its_function_beside_the_args(fleet):
    sig = submit.s(add, 1, resources=Resources(zone="europe-west1-b"))
    assert sig.args == (1,) and sig.options[FUNCTION_OPTION] is add
    assert sig.kwargs["resources"] == Resources(zone="europe-west1-b")


def test_chain_of_three_routes_the_middle_step_elsewhere(fleet):
    c = chain(submit.s(add, 1, 2),
              submit.s(tagged, resources=Resources(worker_ids=["w-c"])),
              submit.s(then_tagged, resources=Resources(zone="europe-west1-b")))
    h = c.apply_async()
    assert h.get(timeout=60) == [3, "w-c", 30, "w-a"]
    # Every step's result is stored signed, like any job's.
    steps = [h, h.parent, h.parent.parent]
    assert all(s is not None and _stored_raw(fleet, s.id).startswith(signing.MAGIC) for s in steps)
    assert h.parent.get(timeout=10) == [3, "w-c"]
    assert h.parent.parent.get(timeout=10) == 3


def test_pipe_operator_and_immutable_step(fleet):
    assert (submit.s(sub, 10, 1) | submit.s(double) | submit.s(sub, 4)).apply_async().get(timeout=60) == 14
    assert (submit.s(add, 1, 2) | submit.si(add, 5, 5)).apply_async().get(timeout=60) == 10


def test_chord_of_20(fleet):
    h = chord([submit.s(double, i) for i in range(20)], submit.s(total)).apply_async()
    assert h.get(timeout=120) == 2 * sum(range(20))
    assert _stored_raw(fleet, h.id).startswith(signing.MAGIC)


def test_group_piped_into_a_signature_is_a_chord(fleet):
    h = (group(submit.s(add, i, i) for i in range(6)) | submit.s(total)).apply_async()
    assert h.get(timeout=120) == 2 * sum(range(6))


def test_chord_body_routes_on_its_own(fleet):
    body = submit.s(tagged, resources=Resources(worker_ids=["w-c"]))
    h = chord([submit.s(double, i, resources=Resources(zone="europe-west1-c")) for i in range(4)], body).apply_async()
    assert h.get(timeout=120) == [[0, 2, 4, 6], "w-c"]


def test_link_gets_the_result(fleet):
    cb = submit.s(sub, 1)
    cb.freeze()  # its id is known now, so its result can be read back
    h = submit.apply_async((add, 20, 22), link=cb)
    assert h.get(timeout=60) == 42
    assert submit.AsyncResult(cb.id).get(timeout=60) == 41
    cb2 = submit.s(double)
    cb2.freeze()
    assert submit.s(add, 1, 2).apply_async(link=cb2).get(timeout=60) == 3
    assert submit.AsyncResult(cb2.id).get(timeout=60) == 6


def test_link_error_gets_the_failed_job_id(fleet):
    eb = submit.s(failed_id)
    eb.freeze()
    h = submit.s(boom, 1).apply_async(link_error=eb)
    with pytest.raises(JobFailed, match="boom 1"):
        h.get(timeout=60)
    assert submit.AsyncResult(eb.id).get(timeout=60) == ["errback", h.id]


def test_partial_delay_and_clone(fleet):
    assert submit.s(add).delay(1, 2).get(timeout=60) == 3
    assert submit.s(sub, 1).delay(10).get(timeout=60) == 9  # Celery prepends partial args
    assert submit.s(sub, 1).clone(args=(10,)).delay().get(timeout=60) == 9
    assert submit.s(sub).clone(args=(10, 4)).apply_async().get(timeout=60) == 6
    assert submit.s(add, 1).apply_async((5,)).get(timeout=60) == 6


def test_map_and_starmap_run_as_one_job(fleet):
    assert submit.map(double, range(5)).apply_async().get(timeout=60) == [0, 2, 4, 6, 8]
    assert submit.starmap(add, [(1, 2), (3, 4)]).delay().get(timeout=60) == [3, 7]
    pinned = submit.map(lambda _: gpulayer.current_worker().id, range(3), resources=Resources(worker_ids=["w-c"]))
    assert pinned.apply_async().get(timeout=60) == ["w-c"] * 3


def test_chunks_give_a_list_of_lists(fleet):
    items = list(zip(range(10), range(10)))
    assert submit.chunks(add, items, 4).apply_async().get(timeout=60) == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]
    g = submit.chunks(add, items, 5).group()
    assert len(g.tasks) == 2
    assert g.apply_async().get(timeout=60) == [[0, 2, 4, 6, 8], [10, 12, 14, 16, 18]]


def test_submit_batch_reads_the_function_from_each_signature(fleet):
    assert submit_batch([submit.s(sub, i, 1) for i in range(20)]).get(timeout=60) == [i - 1 for i in range(20)]


def test_a_job_keyword_may_be_called_fn(fleet):
    assert submit.delay(lambda fn: fn + 1, fn=1).get(timeout=60) == 2


def test_summaries_of_canvas_jobs_name_the_function(fleet):
    sig = submit.map(double, range(3))
    assert sig.options["argsrepr"] == "map(double, [0, 1, 2])"
    from gpulayer.payload import pack_function, summarize

    packed = pack_function(lambda: 1)
    assert isinstance(packed, PickledFunction)
    assert "PickledFunction" not in summarize("apply", (packed,)) and "\\x" not in summarize("apply", (packed,))


def test_unsupported_forms_say_so_at_once(fleet):
    with pytest.raises(PayloadError, match=r"sig.apply\(\)"):
        submit.s(add, 1, 2).apply()
    with pytest.raises(PayloadError, match=r"submit.s\(\) needs the function"):
        submit.s()
    with pytest.raises(PayloadError, match="submit.s needs a callable"):
        submit.s(3, 4)
    with pytest.raises(PayloadError, match="submit.map needs a callable"):
        submit.map(3, [1])
    with pytest.raises(ValueError, match="chunk size"):
        submit.chunks(add, [(1, 2)], 0)
    # Celery's own map forms would call submit inside a worker, outside routing: refused, with the way out
    from celery.canvas import chunks, xmap, xstarmap

    for form in (xmap(submit.s(double), [1, 2]), xstarmap(submit.s(add), [(1, 2)]),
                 chunks(submit.s(add), [(1, 2), (3, 4)], 1)):
        with pytest.raises(PayloadError, match=r"use submit.map\(fn, items\), submit.starmap"):
            form.apply_async()


def test_a_later_step_no_worker_can_run_is_refused_at_once(fleet):
    from gpulayer import JobRejected

    cuda = Resources(cuda=True)
    with pytest.raises(JobRejected, match="CUDA"):
        chain(submit.s(add, 1, 2), submit.s(double), submit.s(double, resources=cuda)).apply_async()
    with pytest.raises(JobRejected, match="CUDA"):
        chord([submit.s(double, i) for i in range(3)], submit.s(total, resources=cuda)).apply_async()
    with pytest.raises(JobRejected, match="CUDA"):
        submit.s(add, 1, 2).apply_async(link=submit.s(double, resources=cuda))


def test_chain_through_a_group_and_a_failing_chord_header(fleet):
    c = chain(submit.s(add, 1, 2), group(submit.s(add, 1), submit.s(add, 2)), submit.s(total))
    assert c.apply_async().get(timeout=120) == 4 + 5
    h = chord([submit.s(double, 1), submit.s(boom, 2)], submit.s(total)).apply_async()
    with pytest.raises(JobFailed, match="boom 2"):
        h.get(timeout=120)
