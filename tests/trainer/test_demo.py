"""The Trainer demo that `gpulayer demo` shows: one process, then two, learning the same function."""

from __future__ import annotations

from gpulayer.trainer.demo import run_training_demo


def test_demo_trains_on_one_and_two_processes():
    lines: list[str] = []
    result = run_training_demo(lines.append, epochs=2)
    one, two = result["devices=1"], result["devices=2"]
    assert one["steps"] == two["steps"] == 64
    assert len(one["losses"]) == len(two["losses"]) == 2  # callback state came back from rank 0
    assert one["losses"][1] < one["losses"][0] and two["losses"][1] < two["losses"][0]
    assert abs(one["losses"][1] - two["losses"][1]) < 0.05
    assert len(lines) == 2 and "2 processes" in lines[1]
