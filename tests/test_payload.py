"""Pure units: what a job carries, and the signature over it."""

from __future__ import annotations

import pickle

import pytest

from gpulayer import signing
from gpulayer.errors import PayloadError, PayloadRejected
from gpulayer.payload import PickledFunction, pack_function, resolve_function, summarize


def train(lr, epochs=1):
    return lr * epochs


def test_summary_is_short_and_readable():
    assert summarize(train, (0.1,), {"epochs": 3}) == "train(0.1, epochs=3)"
    assert summarize("pkg.mod:fit", (b"x" * 5000,)) == "fit(<bytes 5000>)"
    long = summarize(train, ("y" * 1000,) * 20)
    assert len(long) <= 200 and long.endswith("...")


def test_summary_shows_tensors_as_shapes():
    torch = pytest.importorskip("torch")
    assert summarize(train, (torch.zeros(3, 4),)) == "train(Tensor[3, 4]:torch.float32)"


def test_functions_travel_by_value_and_load_once():
    ref = pack_function(lambda x: x + 1)
    assert isinstance(ref, PickledFunction)
    fn = resolve_function(ref)
    assert fn(1) == 2 and resolve_function(ref) is fn


def test_references_are_checked_for_shape():
    assert resolve_function(pack_function("math:sqrt"))(9) == 3
    with pytest.raises(PayloadError, match="package.module:function"):
        pack_function("math.sqrt")
    with pytest.raises(PayloadError, match="callable"):
        pack_function(42)
    with pytest.raises(PayloadError, match="cannot load 'math:nope'"):
        resolve_function("math:nope")


@pytest.fixture
def keyed():
    signing.configure(b"k1", 1024)
    yield
    signing.configure(None, 64 * 2**20)


def test_signed_round_trip(keyed):
    assert signing.loads(signing.dumps({"a": [1, 2]})) == {"a": [1, 2]}


class Boom:
    ran = False

    def __reduce__(self):
        return (Boom._explode, ())

    @staticmethod
    def _explode():
        Boom.ran = True


def test_unsigned_tampered_and_foreign_messages_are_refused_before_unpickling(keyed):
    evil = pickle.dumps(Boom())
    with pytest.raises(PayloadRejected, match="not signed"):
        signing.loads(evil)
    good = signing.dumps([1])
    with pytest.raises(PayloadRejected, match="does not match"):
        signing.loads(good[:-1] + b"\x00")
    signing.configure(b"k2")
    with pytest.raises(PayloadRejected, match="does not match"):
        signing.loads(good)
    assert not Boom.ran


def test_oversized_payload_is_refused_with_the_limit(keyed):
    with pytest.raises(PayloadError, match="over the 0 MiB limit|over the"):
        signing.dumps(b"x" * 4096)


def test_no_secret_means_no_signing():
    signing.configure(None)
    with pytest.raises(PayloadError, match="GPULAYER_SECRET"):
        signing.dumps(1)


def _defined(source: str) -> tuple[dict, object]:
    """The function ``f`` of ``source``, with the namespace it reads its globals from (a user's script)."""
    space: dict = {}
    exec(source, space)
    return space, space["f"]


def test_a_function_is_pickled_once_while_the_globals_it_reads_are_the_same():
    space, f = _defined("K = 2\nimport math\ndef f(x):\n    return math.floor(x * K)\n")
    first = pack_function(f)
    assert pack_function(f) is first  # a loop of submit.delay(f, i) pickles f once
    space["K"] = 3  # a new binding of a global it reads: pickled again, with the new value
    again = pack_function(f)
    assert again is not first and again.digest != first.digest
    assert resolve_function(again)(2) == 6 and resolve_function(first)(2) == 4


def test_what_could_change_in_place_is_pickled_on_every_call():
    space, f = _defined("SCALE = [2]\ndef f(x, seen=()):\n    return x * SCALE[0]\n")
    first = pack_function(f)
    space["SCALE"][0] = 5  # the same list, changed inside: nothing but a new pickle can see that
    again = pack_function(f)
    assert again is not first and resolve_function(again)(1) == 5

    _, g = _defined("def f(x, acc=[]):\n    acc.append(x)\n    return len(acc)\n")  # a mutable default
    assert pack_function(g) is not pack_function(g)


def test_a_helper_rebound_or_a_closure_cell_changed_is_a_new_pickle():
    space, f = _defined("def helper(x):\n    return x + 1\ndef f(x):\n    return helper(x)\n")
    first = pack_function(f)
    assert pack_function(f) is first
    space["helper"] = lambda x: x + 10
    assert resolve_function(pack_function(f))(1) == 11

    def make():
        n = 1

        def add(x):
            return x + n

        def bump():
            nonlocal n
            n += 1
        return add, bump

    add, bump = make()
    before = pack_function(add)
    assert pack_function(add) is before
    bump()
    assert resolve_function(pack_function(add))(1) == 3
