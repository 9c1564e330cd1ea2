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
