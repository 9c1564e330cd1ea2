"""scripts/make_perf_charts.py and scripts/perf_logs.py: parsing the committed raw logs and tiny synthetic ones,
clear failures on a missing or malformed log, and the same PNG bytes from the same logs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="make_perf_charts needs matplotlib (pip install -e '.[test]')")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import make_perf_charts as charts  # noqa: E402
import perf_logs  # noqa: E402
from perf_logs import LogError  # noqa: E402

OLD = REPO / "benchmarks" / "results" / "2026-11-29-vm"
NEW = REPO / "benchmarks" / "results" / "2026-12-01-vm"


def _common():
    """benchmarks/common.py, the writer of the result lines."""
    spec = importlib.util.spec_from_file_location("bench_common", REPO / "benchmarks" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


result_line = _common().result_line


def scaling_log() -> str:
    lines = ["# scaling.py  2026-12-02T10:00:00  host vm  cpus 2  load 1.50", ""]
    for machines, walls in ((2, (30.0, 31.0, 29.0)), (4, (40.0, 42.0, 41.0)), (8, (60.0, 58.0, 59.0))):
        for case, factor, loss in (("gpulayer-two-level", 1.0, 0.51), ("gpulayer-flat", 1.2, 0.512), ("lightning", 1.5, 0.509)):
            for run, wall in enumerate(walls, 1):
                lines.append(result_line("scaling", case, machines=machines, run=run, wall_s=wall * factor, loss=loss))
    return "\n".join(lines) + "\n"


def locality_log() -> str:
    return "\n".join([
        "# locality_run.py  2026-12-02T11:00:00  host vm  load 0.90",
        *(result_line("locality", case, run=run, wall_s=wall + run / 10)
          for case, wall in (("one-zone", 20.0), ("two-zones", 21.0), ("two-regions", 25.0)) for run in range(5)),
        result_line("locality", "auto", wall_s=20.3, stat="median", reason="same zone lab-a (4 workers with 2 free slots)"),
    ]) + "\n"


def throughput_ray_log() -> str:
    return "\n".join([
        "# throughput.py  2026-12-02T12:00:00  host vm  cpus 2  load 1.20",
        *(result_line("throughput", case, config=config, round=r, jobs_s=rate + r)
          for config in ("2x1", "1x2")
          for case, rate in (("gpulayer-submit_batch", 600), ("gpulayer-delay", 350), ("celery", 400), ("ray", 300))
          for r in range(3)),
    ]) + "\n"


# -- parsing the committed logs -------------------------------------------------------------------

def test_lightning_comparison_table():
    cases = perf_logs.parse_lightning_comparison((OLD / "lightning_comparison.txt").read_text(), "lc.txt")
    assert [c.name for c in cases] == ["MLP fp32, batch 256", "MLP bf16-mixed, batch 256", "small CNN fp32, batch 32",
                                       "MLP DDP 2 CPU processes (defaults)"]
    assert (cases[0].raw_ms, cases[0].lightning_ms, cases[0].gpulayer_ms) == (3.189, 4.397, 3.018)
    assert cases[3].gpulayer_ms == 3.16


def test_startup_three_variants_with_runs_and_stages():
    s = perf_logs.parse_startup((NEW / "startup.txt").read_text(), "startup.txt")
    assert s.variants == ("direct", "torchrun", "direct-fresh")
    assert s.median_s == (0.228, 5.687, 3.788)
    assert s.runs_s[1] == (5.687, 6.233, 5.697, 5.145, 5.021)
    assert [label for label, _ in s.stages][::7] == ["distributed() returned", "result in the client"]
    assert s.stages[-1][1] == (0.228, 5.687, 3.788)


def test_startup_older_launcher_format():
    s = perf_logs.parse_startup((OLD / "startup.txt").read_text(), "startup.txt")
    assert s.variants == ("direct", "torchrun")
    assert s.median_s == (9.204, 15.34)
    assert all(len(r) == 5 for r in s.runs_s)
    assert s.stages[2] == ("last rank process started", (0.699, 4.785))


def test_placement_scale_rows_and_goals():
    p = perf_logs.parse_placement_scale((NEW / "placement_scale.txt").read_text(), "ps.txt")
    route = {r.workers: r for r in p.rows if r.what == "route cpu"}
    assert sorted(route) == [10, 100, 1000, 10000]
    assert (route[10000].median_ms, route[10000].before_ms, route[10000].result) == (0.0015, 0.9124, "ok")
    build = next(r for r in p.rows if r.what == "index build")
    assert build.before_ms is None and build.result is None
    assert {r.workers for r in p.rows if r.what == "full read (Registry.read)"} == {1000, 10000}
    assert dict(p.goals_ms)["place_gang 16x4"] == 1.0


def test_throughput_medians_of_the_older_log():
    rows = perf_logs.parse_throughput((OLD / "throughput.txt").read_text(), "tp.txt")
    assert [(r.case, r.config, r.jobs_s) for r in rows] == [
        ("celery", "2x1", 405.0), ("gpulayer-submit_batch", "2x1", 574.0), ("gpulayer-delay", "2x1", 338.0)]


def test_meta_names_the_time_and_load():
    assert perf_logs.meta((OLD / "throughput.txt").read_text()) == "2026-11-29 17:06:39, load 1.08"
    assert perf_logs.meta((NEW / "placement_scale.txt").read_text()) == "2026-12-01 08:49:15, load 9.5"


# -- result {json} lines ----------------------------------------------------------------------------

def test_scaling_takes_the_median_of_the_runs():
    rows = {(r.case, r.machines): r for r in perf_logs.parse_scaling(scaling_log(), "scaling.txt")}
    assert len(rows) == 9
    assert rows[("gpulayer-two-level", 4)].wall_s == 41.0
    assert rows[("lightning", 8)].wall_s == pytest.approx(88.5)
    assert rows[("gpulayer-flat", 2)].loss == 0.512


def test_a_median_line_stands_for_its_group():
    rows = {r.case: r for r in perf_logs.parse_locality(locality_log(), "locality.txt")}
    assert rows["one-zone"].wall_s == pytest.approx(20.2)
    assert rows["auto"].wall_s == 20.3 and rows["auto"].reason.startswith("same zone")
    extra = result_line("locality", "one-zone", wall_s=99.0, stat="median")
    assert {r.case: r for r in perf_logs.parse_locality(locality_log() + extra, "l.txt")}["one-zone"].wall_s == 99.0


def test_throughput_result_lines_per_config_and_other_benches_ignored():
    text = throughput_ray_log() + result_line("startup", "direct", median_s=1.0) + "\n"
    rows = perf_logs.parse_throughput(text, "throughput-ray.txt")
    assert [(r.case, r.config) for r in rows][:5] == [("gpulayer-submit_batch", "2x1"), ("gpulayer-delay", "2x1"),
                                                       ("celery", "2x1"), ("ray", "2x1"), ("gpulayer-submit_batch", "1x2")]
    assert {r.jobs_s for r in rows if r.case == "ray"} == {301.0}


def test_startup_result_lines_win_over_the_text():
    text = (NEW / "startup.txt").read_text() + "\n".join(
        result_line("startup", v, median_s=m, runs_s=[m, m + 1], stages_s={"placed": m / 10, "done": m})
        for v, m in (("direct", 0.2), ("torchrun", 5.0))) + "\n"
    s = perf_logs.parse_startup(text, "startup.txt")
    assert s.variants == ("direct", "torchrun") and s.median_s == (0.2, 5.0)
    assert s.runs_s[1] == (5.0, 6.0) and s.stages == (("placed", (0.02, 0.5)), ("done", (0.2, 5.0)))


def test_the_writers_lines_read_back():
    """What placement_scale.py's Table and lightning_comparison/bench.py write is what the charts read."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_placement_scale", REPO / "benchmarks" / "placement_scale.py")
        ps = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ps)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    table = ps.Table([])
    table.row("route cpu", 100, [0.5, 0.25, 1.0], [2.0, 3.0], "ok")
    table.row("index build", 100, [0.125])
    p = perf_logs.parse_placement_scale("\n".join(table.results), "ps.txt")
    assert p.rows == (perf_logs.PlacementRow("route cpu", 100, 0.5, 1.0, 2.5, "ok"),
                      perf_logs.PlacementRow("index build", 100, 0.125, 0.125, None, None))

    spec = importlib.util.spec_from_file_location("bench_lightning", REPO / "benchmarks" / "lightning_comparison" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ms, st = {"raw": 3.0, "lightning": 4.5, "gpulayer": 2.5}, {"raw": 2.0, "lightning": 2.5, "gpulayer": 2.1}
    text = bench._results([("MLP fp32, batch 256", ms, st)], result_line)
    assert perf_logs.parse_lightning_comparison(text, "lc.txt") == (perf_logs.TrainerCase("MLP fp32, batch 256", 3.0, 4.5, 2.5),)


# -- malformed logs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("line, what", [
    ('result {"bench": "scaling", "case": "lightning", ', "one JSON object"),
    ('result ["scaling"]', '"bench" and "case"'),
    ('result {"bench": "scaling", "machines": 2, "wall_s": 1.0}', '"bench" and "case"'),
    ('result {"bench": "scaling", "case": "lightning", "machines": 2, "wall_s": "fast"}', "'wall_s'"),
    ('result {"bench": "scaling", "case": "lightning", "machines": 2, "wall_s": NaN}', "finite number"),
])
def test_a_malformed_result_line_names_its_file_and_line(line, what):
    text = "# scaling.py\n\n" + line + "\n"
    with pytest.raises(LogError, match=r"^logs/scaling\.txt:3: ") as err:
        perf_logs.parse_scaling(text, "logs/scaling.txt")
    assert what in str(err.value)


def test_a_damaged_table_row_names_its_line():
    lines = (OLD / "lightning_comparison.txt").read_text().splitlines()
    at = next(i for i, s in enumerate(lines) if s.startswith("small CNN"))
    lines[at] = "small CNN fp32, batch 32    11.772   n/a   9.076   1.92x   -22.9%"
    with pytest.raises(LogError, match=rf"^lc\.txt:{at + 1}: expected '<case> <raw>"):
        perf_logs.parse_lightning_comparison("\n".join(lines), "lc.txt")

    lines = (NEW / "placement_scale.txt").read_text().splitlines()
    at = next(i for i, s in enumerate(lines) if s.startswith("route cuda "))
    lines[at] = lines[at].replace("0.0014", "fast", 1)
    with pytest.raises(LogError, match=rf"^ps\.txt:{at + 1}: expected '<what> <workers>"):
        perf_logs.parse_placement_scale("\n".join(lines), "ps.txt")


@pytest.mark.parametrize("parse, writer", [
    (perf_logs.parse_lightning_comparison, "lightning_comparison/bench.py"),
    (perf_logs.parse_startup, "benchmarks/startup.py"),
    (perf_logs.parse_placement_scale, "benchmarks/placement_scale.py"),
    (perf_logs.parse_throughput, "benchmarks/throughput.py"),
    (perf_logs.parse_scaling, "benchmarks/lightning_comparison/scaling.py"),
    (perf_logs.parse_locality, "benchmarks/lightning_comparison/locality_run.py"),
])
def test_a_log_of_something_else_names_the_script_that_writes_the_right_one(parse, writer):
    with pytest.raises(LogError, match=r"^x\.txt: ") as err:
        parse((NEW / "failstop.txt").read_text(), "x.txt")
    assert writer in str(err.value)


# -- the command ------------------------------------------------------------------------------------

@pytest.fixture
def logs(tmp_path) -> Path:
    """A results folder with every kind: four committed logs as they are, and synthetic scaling/locality/Ray."""
    folder = tmp_path / "2026-12-02-vm"
    folder.mkdir()
    shutil.copy(OLD / "lightning_comparison.txt", folder)
    shutil.copy(NEW / "startup.txt", folder)
    shutil.copy(NEW / "placement_scale.txt", folder)
    (folder / "throughput-ray.txt").write_text(throughput_ray_log())
    (folder / "scaling.txt").write_text(scaling_log())
    (folder / "locality.txt").write_text(locality_log())
    return folder


def test_every_chart_twice_gives_the_same_bytes(logs, tmp_path):
    """In this process and in a fresh one (another hash seed): the same files, byte for byte, no version inside."""
    assert charts.main(["--logs", str(logs), "--out", str(tmp_path / "a")]) == 0
    env = {**os.environ, "PYTHONHASHSEED": "12345", "MPLCONFIGDIR": str(tmp_path / "mpl")}
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_perf_charts.py"), "--logs", str(logs),
                    "--out", str(tmp_path / "b")], check=True, env=env, capture_output=True, timeout=240)
    names = sorted(c.file for c in charts.CHARTS)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == names
    for name in names:
        a, b = (tmp_path / "a" / name).read_bytes(), (tmp_path / "b" / name).read_bytes()
        assert a[:8] == b"\x89PNG\r\n\x1a\n" and a == b, name
        assert b"matplotlib" not in a.lower(), name


def test_a_missing_log_exits_2_naming_it_and_its_script(logs, tmp_path, capsys):
    (logs / "scaling.txt").unlink()
    assert charts.main(["--logs", str(logs), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "scaling.png needs scaling.txt, written by benchmarks/lightning_comparison/scaling.py" in err
    assert not (tmp_path / "out").exists()


def test_skip_missing_draws_the_rest_and_lists_what_it_skipped(logs, tmp_path, capsys):
    (logs / "locality.txt").unlink()
    assert charts.main(["--logs", str(logs), "--out", str(tmp_path / "out"), "--skip-missing"]) == 0
    assert "skipped: locality.png needs locality-hidden1024.txt or locality.txt" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        c.file for c in charts.CHARTS if c.file != "locality.png")


def test_a_malformed_log_exits_1_naming_file_and_line(logs, tmp_path, capsys):
    with open(logs / "scaling.txt", "a") as f:
        f.write('result {"bench": "scaling", "case": "lightning", "machines": 16}\n')
    line = len((logs / "scaling.txt").read_text().splitlines())
    assert charts.main(["--logs", str(logs), "--out", str(tmp_path / "out")]) == 1
    assert f"scaling.txt:{line}: 'wall_s' in a 'scaling' result must be a finite number" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing drawn from a set of logs with a bad one


def test_each_log_comes_from_the_newest_folder_that_has_it(tmp_path, monkeypatch):
    old, new = tmp_path / "2026-11-29-vm", tmp_path / "2026-12-01-vm"
    for folder in (old, new, tmp_path / "2026-12-05-laptop"):
        folder.mkdir()
        (folder / "startup.txt").write_text("")
    (old / "throughput.txt").write_text("")
    (new / "throughput.txt").write_text("")
    (new / "throughput-ray.txt").write_text("")
    monkeypatch.setattr(charts, "RESULTS", tmp_path)
    found = charts.choose_logs(None)
    assert found == {"startup": new / "startup.txt", "throughput": new / "throughput-ray.txt"}
    assert charts.choose_logs([str(old)]) == {"startup": old / "startup.txt", "throughput": old / "throughput.txt"}
    pinned = charts.choose_logs([f"startup={old / 'startup.txt'}", str(new)])
    assert pinned["startup"] == old / "startup.txt" and pinned["throughput"] == new / "throughput-ray.txt"
    assert charts.choose_logs([str(NEW / "lightning_comparison_ddp.txt")]) == {"trainer": NEW / "lightning_comparison_ddp.txt"}
    with pytest.raises(ValueError, match="which chart is it for"):
        charts.choose_logs([str(NEW / "failstop.txt")])
    with pytest.raises(ValueError, match="unknown chart kind 'speed'"):
        charts.choose_logs([f"speed={NEW / 'failstop.txt'}"])
