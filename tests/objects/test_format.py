"""The object file format: every kind of value round-trips; tensors and arrays come back viewing the mapped file
(no copy, writes stay private); a tampered file is refused before anything is unpickled."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from gpulayer.errors import PayloadRejected
from gpulayer.objects import format as fmt

SECRET = b"test-secret"


def stored(tmp_path, value, name="obj"):
    path = tmp_path / name
    with open(path, "wb") as f:
        written = fmt.dump(value, f.write, SECRET)
    assert written == os.path.getsize(path) == fmt.prepare(value, SECRET).size
    return path


def mapped_ranges(path) -> list[tuple[int, int]]:
    """Address ranges this process maps from ``path`` (/proc/self/maps)."""
    real = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return out


def inside(ptr: int, ranges) -> bool:
    return any(lo <= ptr < hi for lo, hi in ranges)


def user_function(x):
    return x * 3 + 1


class Plain:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return type(other) is Plain and (self.a, self.b) == (other.a, other.b)


def test_a_tensor_comes_back_viewing_the_mapped_file_and_writes_stay_private(tmp_path):
    t = torch.randn(512, 256)
    path = stored(tmp_path, t)
    before = path.read_bytes()
    got = fmt.load(path, SECRET)
    assert type(got) is torch.Tensor and got.dtype == torch.float32 and got.shape == (512, 256)
    assert torch.equal(got, t)
    ranges = mapped_ranges(path)
    assert inside(got.data_ptr(), ranges) and inside(got.data_ptr() + got.nbytes - 1, ranges)
    assert got.data_ptr() % fmt.ALIGN == 0
    got[0, 0] = 12345.0  # writable: the map is copy-on-write
    assert got[0, 0] == 12345.0
    assert path.read_bytes() == before  # the file never changes
    assert fmt.load(path, SECRET)[0, 0] == t[0, 0]


def test_bfloat16_parameter_grad_and_odd_tensors_round_trip(tmp_path):
    bf = torch.randn(300, 300).to(torch.bfloat16)
    param = torch.nn.Parameter(torch.randn(200, 100))
    grad = torch.randn(100, 200, requires_grad=True)
    view = torch.arange(100_000, dtype=torch.int64)[10:90_000:3]  # not contiguous, offset in its storage
    value = {"bf": bf, "param": param, "grad": grad, "view": view, "empty": torch.empty(0, 5),
             "scalar": torch.tensor(3.5), "tiny": torch.arange(4), "bool": torch.ones(70_000, dtype=torch.bool)}
    got = fmt.load(stored(tmp_path, value), SECRET)
    assert got["bf"].dtype == torch.bfloat16 and torch.equal(got["bf"], bf)
    assert type(got["param"]) is torch.nn.Parameter and got["param"].requires_grad
    assert torch.equal(got["param"].data, param.data)
    assert got["grad"].requires_grad and got["grad"].is_leaf and torch.equal(got["grad"].detach(), grad.detach())
    assert torch.equal(got["view"], view)
    assert got["empty"].shape == (0, 5)
    assert got["scalar"].shape == () and got["scalar"].item() == 3.5
    assert torch.equal(got["tiny"], torch.arange(4)) and torch.equal(got["bool"], value["bool"])


def test_numpy_nested_containers_bytes_objects_and_functions_round_trip(tmp_path):
    arr = np.random.default_rng(0).standard_normal((400, 300))
    big = os.urandom(300_000)
    value = {
        "arr": arr, "fortran": np.asfortranarray(arr[:50]), "small": np.arange(5),
        "nested": [torch.ones(50_000), (big, bytearray(b"x" * 100_000)), {"deep": [torch.zeros(3), "text"]}],
        "same": big,  # the same bytes object twice: stored once
        "bytes": b"small", "plain": Plain(1, [2, 3]), "fn": user_function, "lam": lambda y: y - 1, "none": None,
    }
    path = stored(tmp_path, value)
    assert os.path.getsize(path) < 2 * (arr.nbytes + 50 * 300 * 8 + 200_000 + len(big) + 100_000)
    got = fmt.load(path, SECRET)
    assert np.array_equal(got["arr"], arr) and got["arr"].dtype == arr.dtype
    assert inside(got["arr"].ctypes.data, mapped_ranges(path))  # arrays are zero-copy too
    assert np.array_equal(got["fortran"], value["fortran"]) and np.array_equal(got["small"], np.arange(5))
    assert torch.equal(got["nested"][0], torch.ones(50_000))
    assert got["nested"][1][0] == big and type(got["nested"][1][0]) is bytes
    assert got["nested"][1][1] == bytearray(b"x" * 100_000) and type(got["nested"][1][1]) is bytearray
    assert got["same"] is got["nested"][1][0]
    assert got["nested"][2]["deep"][1] == "text" and got["bytes"] == b"small" and got["none"] is None
    assert got["plain"] == Plain(1, [2, 3])
    assert got["fn"](2) == 7 and got["lam"](5) == 4


def test_a_plain_value_round_trips(tmp_path):
    for i, value in enumerate([7, "text", [1, 2.5, None], (), {"a": {"b": [b"c"]}}]):
        assert fmt.load(stored(tmp_path, value, f"v{i}"), SECRET) == value


def test_large_buffers_are_written_from_the_values_own_memory(tmp_path):
    t = torch.randn(1000, 1000)
    prepared = fmt.prepare(t, SECRET)
    assert len(prepared.body) < 1000  # the pickle holds no tensor bytes
    assert len(prepared.buffers) == 1 and prepared.buffers[0].nbytes == t.nbytes
    # the view given to the file is the tensor's memory itself, not a copy
    assert np.frombuffer(prepared.buffers[0], dtype=np.uint8).ctypes.data == t.data_ptr()


def test_a_tampered_pickle_is_refused_before_unpickling(tmp_path, monkeypatch):
    path = stored(tmp_path, {"t": torch.ones(100_000), "x": "hello"})
    data = bytearray(path.read_bytes())
    at = data.index(b"hello")
    data[at: at + 5] = b"jelly"
    path.write_bytes(bytes(data))
    calls = []
    real = pickle.Unpickler.load
    monkeypatch.setattr(fmt._Unpickler, "load", lambda self: calls.append(1) or real(self))
    with pytest.raises(PayloadRejected, match="signature does not match"):
        fmt.load(path, SECRET)
    assert calls == []
    with pytest.raises(PayloadRejected, match="signature"):  # another cluster's secret
        fmt.load(stored(tmp_path, [1, 2], "other"), b"another-secret")
    (tmp_path / "junk").write_bytes(b"\x80\x05junk" * 20)
    with pytest.raises(PayloadRejected, match="not a gpulayer object file"):
        fmt.load(tmp_path / "junk", SECRET)
    (tmp_path / "short").write_bytes(stored(tmp_path, torch.ones(100_000), "whole").read_bytes()[:4000])
    with pytest.raises(PayloadRejected, match="cut short"):
        fmt.load(tmp_path / "short", SECRET)
    assert calls == []


def test_measure_is_cheap_and_about_right():
    assert fmt.measure(torch.ones(1000, 1000)) == 4_000_000
    assert fmt.measure(np.ones((10, 10))) == 800
    assert fmt.measure(b"x" * 100) == 100 and fmt.measure("abc") == 3 and fmt.measure(5) == 8
    assert fmt.measure([torch.ones(10), {"k": np.ones(3)}]) == 40 + 1 + 24
    assert fmt.measure(Plain(1, 2)) is None
    assert fmt.measure([Plain(1, 2), torch.ones(1000)]) is None
    assert fmt.measure([Plain(1, 2), torch.ones(1000)], enough=4000) >= 4000  # the known part is enough
    assert 7_000_000 <= fmt.measure(list(range(1_000_000))) <= 9_000_000  # a long list: sampled, scaled
    assert fmt.measure([[[[1]]]]) is None  # deeper than it looks


def test_summary_names_the_shape_and_size():
    assert fmt.summary(torch.ones(50_000, 1_000), 200_000_128) == "Tensor[50000, 1000]:float32 190.7 MiB"
    assert fmt.summary({"a": 1}, 3 * 2**30) == "dict(1) 3.0 GiB"
