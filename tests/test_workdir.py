"""A gang's working directory on one worker (``gpulayer/gang/workdir.py``): pure units on a temp dir."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest

from gpulayer.gang import workdir


def archive_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_prepare_unpacks_once_and_an_attempt_after_finds_what_the_last_one_wrote(tmp_path):
    base = workdir.base_for(tmp_path, "g1", "w/a")
    assert base.name == "gang-g1-w_a"
    calls = []

    def archive():
        calls.append(1)
        return archive_of({"train.py": b"print(1)\n", "pkg/mod.py": b"x = 1\n"})

    work = workdir.prepare(base, "g1", "w/a", archive, keep=False)
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()) == ["pkg/mod.py", "train.py"]
    (work / "snapshot.pt").write_bytes(b"state")
    assert workdir.prepare(base, "g1", "w/a", archive, keep=False) == work  # the restart: same place
    assert (work / "snapshot.pt").read_bytes() == b"state" and len(calls) == 1


def test_a_half_unpacked_directory_is_unpacked_again(tmp_path):
    base = workdir.base_for(tmp_path, "g1", "w1")
    (base / "work").mkdir(parents=True)
    (base / "work" / "junk").write_text("from a worker killed while unpacking")  # no manifest
    work = workdir.prepare(base, "g1", "w1", lambda: archive_of({"a.py": b"1"}), keep=False)
    assert sorted(os.listdir(work)) == ["a.py"]


def test_collect_packs_new_and_changed_files_only(tmp_path):
    base = workdir.base_for(tmp_path, "g1", "w1")
    work = workdir.prepare(base, "g1", "w1", lambda: archive_of({"a.py": b"1", "b.py": b"2"}), keep=False)
    (work / "a.py").write_text("changed")
    (work / "out").mkdir()
    (work / "out" / "result.txt").write_text("42")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"cache")
    blob, files = workdir.collect(base)
    assert sorted(files) == [("a.py", 7), ("out/result.txt", 2)]
    dest = tmp_path / "client"
    assert sorted(workdir.unpack_pulled(blob, dest)) == ["a.py", "out/result.txt"]
    assert (dest / "out" / "result.txt").read_text() == "42" and not (dest / "b.py").exists()


def test_collect_past_the_limit_names_the_biggest_files(tmp_path):
    base = workdir.base_for(tmp_path, "g1", "w1")
    work = workdir.prepare(base, "g1", "w1", lambda: archive_of({"a.py": b"1"}), keep=False)
    (work / "ckpt.pt").write_bytes(b"x" * 3 * 2**20)
    (work / "small.txt").write_bytes(b"x" * 2**20)
    with pytest.raises(workdir.PullTooBig) as err:
        workdir.collect(base, max_bytes=2 * 2**20)
    message = str(err.value)
    assert "\n" not in message and "4.0 MiB" in message and "over the 2 MiB" in message
    assert message.index("ckpt.pt (3.0 MiB)") < message.index("small.txt (1.0 MiB)")
    assert "--keep-workdir" in message


@pytest.mark.parametrize("outcome, attempt, max_restarts, cancelled, aborted, all_results, expected", [
    ("succeeded", 0, 0, False, False, True, (True, True)),     # the last node done: pull and remove
    ("succeeded", 0, 0, False, False, False, (True, False)),   # other nodes still running: the sweep removes
    ("failed", 0, 1, False, False, False, (False, False)),     # restarts left: keep it for the next attempt
    ("stopped", 0, 1, False, False, False, (False, False)),
    ("failed", 1, 1, False, False, False, (True, True)),       # no restarts left: the failed job's files come back
    ("stopped", 0, 3, True, False, False, (True, True)),       # cancelled
    ("failed", 0, 1, False, True, False, (False, True)),       # the worker is shutting down
])
def test_end_of_attempt(outcome, attempt, max_restarts, cancelled, aborted, all_results, expected):
    assert workdir.end_of_attempt(outcome, attempt, max_restarts, cancelled=cancelled, aborted=aborted,
                                  all_results=all_results) == expected


def test_sweep_removes_this_workers_directories_of_gangs_that_ended(tmp_path):
    made = {}
    for gang, worker in [("done", "w1"), ("running", "w1"), ("busy", "w1"), ("kept", "w1"), ("done", "w2")]:
        base = workdir.base_for(tmp_path, gang, worker)
        (base / "work").mkdir(parents=True)
        made[gang, worker] = base
    (made["kept", "w1"] / "kept").touch()
    (tmp_path / "gpulayer-other").mkdir()
    asked = []

    def over(gang_id):
        asked.append(gang_id)
        return gang_id != "running"

    removed = workdir.sweep(tmp_path, "w1", {made["busy", "w1"]}, over)
    assert removed == [made["done", "w1"]]
    assert sorted(asked) == ["done", "running"]  # busy and kept ones are not even looked up
    assert sorted(os.listdir(tmp_path)) == sorted(["gpulayer-other", made["running", "w1"].name, made["busy", "w1"].name,
                                                   made["kept", "w1"].name, made["done", "w2"].name])


def test_each_cluster_has_its_own_root_and_a_sweep_never_leaves_it(tmp_path):
    """Two clusters on one host, workers of the same name, one temp root: each sweep sees its own root only."""
    mine, theirs = workdir.root("c0ffee", tmp_path), workdir.root("beef00", tmp_path)
    assert mine == tmp_path / "gpulayer-c0ffee" and workdir.root("a/b").parent == Path(tempfile.gettempdir())
    for root in (mine, theirs):
        for gang in ("g-over", "g-running"):
            (workdir.make(workdir.base_for(root, gang, "local-1")) / "work").mkdir()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700

    removed = workdir.sweep(mine, "local-1", set(), lambda gang_id: True)  # our Redis knows none of theirs
    assert sorted(p.name for p in removed) == ["gang-g-over-local-1", "gang-g-running-local-1"]
    assert not mine.exists()  # empty: gone with its last directory; make() brings it back
    assert sorted(os.listdir(theirs)) == ["gang-g-over-local-1", "gang-g-running-local-1"]
    assert workdir.make(workdir.base_for(mine, "g2", "local-1")).is_dir()


def test_a_cluster_root_someone_else_can_write_is_refused(tmp_path):
    root = workdir.root("c0ffee", tmp_path)
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    with pytest.raises(PermissionError, match="not this user's own directory"):
        workdir.make(workdir.base_for(root, "g1", "local-1"))
    assert os.listdir(root) == []


# -- where a restarted attempt starts (``for_attempt``, ``--restart-from``) -----------------------

SHIPPED = {"train.py": b"print(1)\n", "helper.py": b"x = 1\n"}


def _attempt0(tmp_path, worker: str, written: dict[str, bytes]):
    """A worker's directory after attempt 0, in which its ranks wrote ``written``."""
    base = workdir.base_for(tmp_path, "g1", worker)
    work, how = workdir.for_attempt(base, "g1", worker, lambda: archive_of(SHIPPED), False, attempt=0,
                                    restart_from="node0", node0=lambda: pytest.fail("attempt 0 needs no node 0"))
    assert how == "own"
    for name, data in written.items():
        (work / name).write_bytes(data)
    return base, work


def _files(work) -> dict[str, bytes]:
    return {p.relative_to(work).as_posix(): p.read_bytes() for p in work.rglob("*") if p.is_file()}


def _node0(tmp_path):
    """Node 0 (w0) wrote a snapshot at epoch 3 and changed helper.py; what its agent packs for the restart."""
    base0, _ = _attempt0(tmp_path, "w0", {"snapshot.json": b'{"epoch": 3}', "helper.py": b"x = 2\n"})
    blob, _ = workdir.collect(base0)
    return base0, workdir.Node0Files(attempt=0, worker="w0", archive=blob)


def test_node0_a_restart_starts_every_other_node_from_node_0s_files(tmp_path):
    base0, packed = _node0(tmp_path)
    base1, _ = _attempt0(tmp_path, "w1", {"snapshot.json": b'{"epoch": 0}', "only-on-w1": b"stale"})
    shipped = lambda: archive_of(SHIPPED)  # noqa: E731
    work1, how = workdir.for_attempt(base1, "g1", "w1", shipped, False, attempt=1, restart_from="node0",
                                     node0=lambda: packed)
    # What a shared file system would show: node 0's files, and nothing node 1 alone had written.
    assert _files(work1) == {"train.py": b"print(1)\n", "helper.py": b"x = 2\n", "snapshot.json": b'{"epoch": 3}'}
    assert how == "node0: 2 files from w0"
    # A worker new to the gang gets the same; node 0's files count as changed (they come back at the end).
    base2 = workdir.base_for(tmp_path, "g1", "w2")
    work2, _ = workdir.for_attempt(base2, "g1", "w2", shipped, False, attempt=1, restart_from="node0",
                                   node0=lambda: packed)
    assert _files(work2) == _files(work1)
    assert sorted(rel for rel, _ in workdir.changed(base2)) == ["helper.py", "snapshot.json"]
    # Node 0's own worker keeps its directory as it is (it is those files, and more).
    (base0 / "work" / "cache.bin").write_bytes(b"kept")
    work0, how = workdir.for_attempt(base0, "g1", "w0", lambda: pytest.fail("no unpacking"), False, attempt=1,
                                     restart_from="node0", node0=lambda: packed)
    assert (work0 / "cache.bin").read_bytes() == b"kept" and how == "node0: this worker was node 0"


def test_node0_without_node_0s_files_each_node_keeps_its_own_and_says_why(tmp_path):
    base1, _ = _attempt0(tmp_path, "w1", {"mine": b"1"})
    shipped = lambda: archive_of(SHIPPED)  # noqa: E731
    stale = workdir.Node0Files(attempt=0, worker="w0", archive=archive_of({"snapshot.json": b"old"}))
    too_big = workdir.Node0Files(attempt=0, worker="w0", error="node 0's ranks wrote 60.0 MiB")
    for attempt, files, why in [(1, None, "not there"), (2, stale, "of attempt 1 are not there"),
                                (1, too_big, "60.0 MiB")]:
        work, how = workdir.for_attempt(base1, "g1", "w1", shipped, False, attempt=attempt, restart_from="node0",
                                        node0=lambda: files)
        assert how.startswith("own: ") and why in how
        assert (work / "mine").read_bytes() == b"1"


def test_own_keeps_each_workers_directory_and_fresh_starts_from_the_shipped_copy(tmp_path):
    _, packed = _node0(tmp_path)
    shipped = lambda: archive_of(SHIPPED)  # noqa: E731
    base1, _ = _attempt0(tmp_path, "w1", {"snapshot.json": b'{"epoch": 1}'})
    work, how = workdir.for_attempt(base1, "g1", "w1", shipped, False, attempt=1, restart_from="own",
                                    node0=lambda: packed)
    assert how == "own" and _files(work) == {**SHIPPED, "snapshot.json": b'{"epoch": 1}'}
    work, how = workdir.for_attempt(base1, "g1", "w1", shipped, False, attempt=1, restart_from="fresh",
                                    node0=lambda: packed)
    assert how == "fresh" and _files(work) == SHIPPED
    (work / "late").write_bytes(b"x")
    base0 = workdir.base_for(tmp_path, "g1", "w0")  # node 0 itself starts again from the shipped copy too
    work0, _ = workdir.for_attempt(base0, "g1", "w0", shipped, False, attempt=1, restart_from="fresh",
                                   node0=lambda: packed)
    assert _files(work0) == SHIPPED
