"""Read the benchmarks' raw logs (``benchmarks/results/<date>-<host>/*.txt``) into plain values for the charts.

One pure function per log kind: ``parse_<kind>(text, path)`` returns the figures or raises ``LogError``
naming the file and line. Two formats are read:

- ``result {json}`` lines (``benchmarks/common.py``'s ``result_line``): the word ``result``, a space, a JSON
  object with at least ``bench`` and ``case``, plus numbers. Where several lines share a case (one per run),
  the median is charted; a line with ``"stat": "median"`` is taken as its group's figure as it stands.
- the text tables of logs written before the scripts printed ``result`` lines (``lightning_comparison.txt``,
  ``startup.txt``, ``placement_scale.txt``, ``throughput.txt``); a log with ``result`` lines for its
  benchmark is read from those alone.
"""

from __future__ import annotations

import ast
import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass


class LogError(ValueError):
    """A log that is not in the format its benchmark writes; the message names the file and the line."""

    def __init__(self, path: str, line: int | None, what: str):
        super().__init__(f"{path}:{line}: {what}" if line else f"{path}: {what}")


# -- the figures --------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainerCase:
    name: str
    raw_ms: float
    lightning_ms: float
    gpulayer_ms: float


@dataclass(frozen=True)
class Startup:
    variants: tuple[str, ...]                           # in the log's order
    median_s: tuple[float, ...]                         # per variant
    runs_s: tuple[tuple[float, ...], ...]               # per variant; empty where the log has no run table
    stages: tuple[tuple[str, tuple[float, ...]], ...]   # (label, offset per variant), in time order


@dataclass(frozen=True)
class PlacementRow:
    what: str
    workers: int
    median_ms: float
    p99_ms: float
    before_ms: float | None
    result: str | None


@dataclass(frozen=True)
class Placement:
    rows: tuple[PlacementRow, ...]
    goals_ms: tuple[tuple[str, float], ...]             # ('route', 0.05), ...: the goals at 10,000 workers


@dataclass(frozen=True)
class Throughput:
    case: str      # gpulayer-submit_batch | gpulayer-delay | celery | ray
    config: str    # workers x slots, e.g. 2x1
    jobs_s: float


@dataclass(frozen=True)
class Scaling:
    case: str      # gpulayer-two-level | gpulayer-flat | lightning
    machines: int
    wall_s: float
    loss: float | None


@dataclass(frozen=True)
class Locality:
    case: str      # one-zone | two-zones | two-regions | auto
    wall_s: float
    reason: str | None


# -- result {json} lines --------------------------------------------------------------------------

def result_records(text: str, path: str, bench: str) -> list[tuple[int, dict]]:
    """Every ``result {json}`` line of ``bench``, as (line number, object); any malformed one raises."""
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        if not (line == "result" or line.startswith("result ")):
            continue
        try:
            rec = json.loads(line[len("result"):])
        except json.JSONDecodeError as err:
            raise LogError(path, no, f"a `result` line must carry one JSON object ({err.msg}): {line!r}") from err
        if not isinstance(rec, dict) or not isinstance(rec.get("bench"), str) or not isinstance(rec.get("case"), str):
            raise LogError(path, no, f'a `result` line needs a JSON object with "bench" and "case" strings: {line!r}')
        if rec["bench"] == bench:
            out.append((no, rec))
    return out


def finite(value, what: str, path: str, no: int) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LogError(path, no, f"{what} must be a finite number, found {value!r}")
    return float(value)


def number(rec: dict, key: str, path: str, no: int, optional: bool = False) -> float | None:
    """``rec[key]`` as a finite number (None if ``optional`` and absent or null)."""
    value = rec.get(key)
    if value is None and optional:
        return None
    return finite(value, f"{key!r} in a {rec['bench']!r} result", path, no)


def grouped(records: list[tuple[int, dict]], keys: tuple[str, ...]) -> list[tuple[tuple, list[tuple[int, dict]]]]:
    """Records grouped by ``keys`` in order of first appearance; a group's ``"stat": "median"`` lines win."""
    groups: dict[tuple, list[tuple[int, dict]]] = {}
    for no, rec in records:
        groups.setdefault(tuple(rec.get(k) for k in keys), []).append((no, rec))
    out = []
    for key, recs in groups.items():
        medians = [(no, r) for no, r in recs if r.get("stat") == "median"]
        out.append((key, medians or recs))
    return out


def median_of(recs: list[tuple[int, dict]], key: str, path: str, optional: bool = False) -> float | None:
    values = [number(r, key, path, no, optional) for no, r in recs]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _require(records: list, path: str, bench: str, writer: str) -> None:
    if not records:
        raise LogError(path, None, f'no `result {{"bench": "{bench}", ...}}` lines (written by {writer})')


# -- old text tables -----------------------------------------------------------------------------

def _find(lines: list[str], test: Callable[[str], bool], start: int = 0) -> int | None:
    return next((i for i in range(start, len(lines)) if test(lines[i])), None)


def _block(lines: list[str], start: int) -> list[tuple[int, str]]:
    """(line number, line) from ``start`` up to the next blank line."""
    out = []
    for i in range(start, len(lines)):
        if not lines[i].strip():
            break
        out.append((i + 1, lines[i]))
    return out


def _rows(lines: list[str], start: int, pattern: re.Pattern, expected: str, path: str) -> list[tuple[int, re.Match]]:
    """The table rows from ``start`` up to the next blank line, each matched by ``pattern``; at least one."""
    rows = [(no, pattern.match(line), line) for no, line in _block(lines, start)]
    for no, m, line in rows:
        if not m:
            raise LogError(path, no, f"expected {expected}, found {line!r}")
    if not rows:
        raise LogError(path, start + 1, f"expected {expected}, found no rows")
    return [(no, m) for no, m, _ in rows]


NUM = r"-?\d+(?:\.\d+)?"


def meta(text: str) -> str:
    """When the log was written and the load average it states, for a chart's footer ('' if neither)."""
    head = "\n".join(text.splitlines()[:3])
    when = re.search(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d)?", head)
    load = re.search(r"load(?: average)? (\d+(?:\.\d+)?)", head)
    parts = ([when.group(0).replace("T", " ")] if when else []) + ([f"load {load.group(1)}"] if load else [])
    return ", ".join(parts)


# -- one parser per log kind -----------------------------------------------------------------------

TRAINER_ROW = re.compile(rf"^(?P<name>\S.*?)\s+(?P<raw>{NUM})\s+(?P<lightning>{NUM})\s+(?P<gpulayer>{NUM})\s+\S+x\s+\S+%$")


def parse_lightning_comparison(text: str, path: str) -> tuple[TrainerCase, ...]:
    """``benchmarks/lightning_comparison/bench.py``: ms/step per case for the raw loop, Lightning and gpulayer."""
    records = result_records(text, path, "lightning_comparison")
    if records:
        return tuple(TrainerCase(r["case"], *(number(r, f"{f}_ms_per_step", path, no)
                                               for f in ("raw", "lightning", "gpulayer"))) for no, r in records)
    lines = text.splitlines()
    head = _find(lines, lambda s: s.startswith("case") and "raw ms/step" in s)
    if head is None:
        raise LogError(path, None, "no `result` lines with bench 'lightning_comparison' and no "
                                   "'case  raw ms/step  lightning  gpulayer' table (written by lightning_comparison/bench.py)")
    rows = _rows(lines, head + 1, TRAINER_ROW, "'<case> <raw> <lightning> <gpulayer> <N.NNx> <+N.N%>'", path)
    return tuple(TrainerCase(m["name"], float(m["raw"]), float(m["lightning"]), float(m["gpulayer"])) for _, m in rows)


RUN_ROW = re.compile(rf"^\s*\d+\s+(?P<variant>\S+)\s+(?P<elapsed>{NUM})\s+{NUM}$")
MEDIAN_ITEM = re.compile(rf"^(?P<variant>\S+) (?P<s>{NUM}) s$")


def parse_startup(text: str, path: str) -> Startup:
    """``benchmarks/startup.py``: submit-to-result seconds per launcher variant, its runs, and where the time goes."""
    records = result_records(text, path, "startup")
    if records:
        return _startup_from_records(records, path)
    lines = text.splitlines()
    at = _find(lines, lambda s: s.startswith("medians over "))
    if at is None:
        raise LogError(path, None, "no `result` lines with bench 'startup' and no 'medians over N runs: ...' line "
                                   "(written by benchmarks/startup.py)")
    variants, medians = [], []
    for item in lines[at].split(": ", 1)[-1].split(", "):
        m = MEDIAN_ITEM.match(item.strip())
        if not m:
            raise LogError(path, at + 1, f"expected '<variant> <seconds> s' in the medians, found {item!r}")
        variants.append(m["variant"])
        medians.append(float(m["s"]))
    runs: dict[str, list[float]] = {v: [] for v in variants}
    head = _find(lines, lambda s: re.match(r"^run\s+(variant|launcher)\s", s) is not None)
    expected = f"'<run> <variant> <submit->result s> <placed s>' for one of {variants}"
    for no, m in _rows(lines, head + 1, RUN_ROW, expected, path) if head is not None else ():
        if m["variant"] not in runs:
            raise LogError(path, no, f"expected {expected}, found {lines[no - 1]!r}")
        runs[m["variant"]].append(float(m["elapsed"]))
    stages = []
    where = _find(lines, lambda s: s.startswith("where the time goes"))
    if where is not None:
        block = _block(lines, where + 1)
        names = block[0][1].split()[1:] if block and block[0][1].split()[:1] == ["stage"] else None
        if names != variants:
            raise LogError(path, where + 2, f"expected a 'stage {' '.join(variants)}' header, found "
                                            f"{block[0][1] if block else ''!r}")
        row = re.compile(rf"^\s+(?P<label>\S.*?)(?P<cells>(?:\s+{NUM}){{{len(variants)}}})\s*$")
        for no, line in block[1:]:
            m = row.match(line)
            if not m:
                raise LogError(path, no, f"expected '<stage> ' and {len(variants)} offsets, found {line!r}")
            stages.append((m["label"], tuple(float(c) for c in m["cells"].split())))
    return Startup(tuple(variants), tuple(medians), tuple(tuple(runs[v]) for v in variants), tuple(stages))


def _startup_from_records(records: list[tuple[int, dict]], path: str) -> Startup:
    variants, medians, runs, stage_maps = [], [], [], []
    for no, rec in records:
        variants.append(rec["case"])
        medians.append(number(rec, "median_s", path, no))
        each_run, stages = rec.get("runs_s") or [], rec.get("stages_s") or {}
        if not isinstance(each_run, list) or not isinstance(stages, dict):
            raise LogError(path, no, f"'runs_s' must be a list of seconds and 'stages_s' map stage names to seconds, "
                                     f"found {each_run!r} and {stages!r}")
        runs.append(tuple(finite(v, "each of 'runs_s'", path, no) for v in each_run))
        stage_maps.append({k: finite(v, f"stage {k!r}", path, no) for k, v in stages.items()})
    labels = list(stage_maps[0]) if all(list(m) == list(stage_maps[0]) for m in stage_maps) else []
    stages = tuple((label, tuple(m[label] for m in stage_maps)) for label in labels)
    return Startup(tuple(variants), tuple(medians), tuple(runs), stages)


PLACEMENT_ROW = re.compile(rf"^(?P<what>\S.*?)\s+(?P<workers>\d+)\s+(?P<median>{NUM})\s+(?P<p99>{NUM})"
                           rf"(?:\s+(?P<before>{NUM})\s+\S+x)?(?:\s+(?P<result>ok|waits|rejected))?\s*$")


def parse_placement_scale(text: str, path: str) -> Placement:
    """``benchmarks/placement_scale.py``: median and p99 ms per call of placement and registry reads, per fleet size."""
    lines = text.splitlines()
    goals = _placement_goals(lines, path)
    records = result_records(text, path, "placement_scale")
    if records:
        rows = tuple(PlacementRow(r["case"], int(number(r, "workers", path, no)), number(r, "median_ms", path, no),
                                  number(r, "p99_ms", path, no), number(r, "before_ms", path, no, optional=True),
                                  r.get("result")) for no, r in records)
        return Placement(rows, goals)
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("what ") or "median ms" not in line:
            continue
        expected = "'<what> <workers> <median ms> <p99 ms> [<before ms> <N.Nx>] [ok|waits|rejected]'"
        # Indented lines inside the registry table are its breakdown (Redis CPU and bytes per read, parse rows):
        # notes, not placement rows.
        table = lines[:i + 1] + [ln for ln in lines[i + 1:] if not ln.startswith("  ")]
        rows += [PlacementRow(m["what"], int(m["workers"]), float(m["median"]), float(m["p99"]),
                              float(m["before"]) if m["before"] else None, m["result"])
                 for _, m in _rows(table, i + 1, PLACEMENT_ROW, expected, path)]
    if not rows:
        raise LogError(path, None, "no `result` lines with bench 'placement_scale' and no 'what  workers  median ms' "
                                   "table (written by benchmarks/placement_scale.py)")
    return Placement(tuple(rows), goals)


def _placement_goals(lines: list[str], path: str) -> tuple[tuple[str, float], ...]:
    at = _find(lines, lambda s: s.startswith("goals at 10,000 workers (ms): "))
    if at is None:
        return ()
    try:
        goals = ast.literal_eval(lines[at].split(": ", 1)[1])
    except (ValueError, SyntaxError) as err:
        raise LogError(path, at + 1, f"the goals must be a dict literal, found {lines[at]!r}") from err
    if not isinstance(goals, dict) or not all(isinstance(v, int | float) for v in goals.values()):
        raise LogError(path, at + 1, f"the goals must map names to milliseconds, found {goals!r}")
    return tuple((str(k), float(v)) for k, v in goals.items())


THROUGHPUT_SIDES = {"plain delay": "celery", "gpulayer batch": "gpulayer-submit_batch", "gpulayer delay": "gpulayer-delay"}
THROUGHPUT_ROW = re.compile(rf"^\s+(?P<side>\S.*?)\s+{NUM}\s+{NUM}\s+(?P<rate>{NUM})$")


def parse_throughput(text: str, path: str) -> tuple[Throughput, ...]:
    """``benchmarks/throughput.py``: tiny jobs per second for gpulayer, plain Celery (and Ray), per fleet shape."""
    records = result_records(text, path, "throughput")
    if records:
        return tuple(Throughput(case, str(config), median_of(recs, "jobs_s", path))
                     for (case, config), recs in grouped(records, ("case", "config")))
    lines = text.splitlines()
    out: list[Throughput] = []
    at = 0
    while True:  # one 'medians over N rounds' table per fleet shape, each after its '## gpulayer W worker(s) ...'
        at = _find(lines, lambda s: s.startswith("medians over ") and "rounds" in s, at)
        if at is None:
            break
        shapes = [m for line in lines[:at] if (m := re.search(r"gpulayer (\d+) worker\(s\) x (\d+) slot\(s\)", line))]
        config = f"{shapes[-1][1]}x{shapes[-1][2]}" if shapes else "?"
        if at + 1 >= len(lines) or "jobs/s" not in lines[at + 1]:
            raise LogError(path, at + 2, "a 'medians over N rounds' table without its 'side ... jobs/s' header")
        rows = _rows(lines, at + 2, THROUGHPUT_ROW, "'<side> <submit s> <end-to-end s> <jobs/s>'", path)
        out += [Throughput(THROUGHPUT_SIDES.get(m["side"], m["side"]), config, float(m["rate"])) for _, m in rows]
        at += 1
    if not out:
        raise LogError(path, None, "no `result` lines with bench 'throughput' and no 'medians over N rounds' table "
                                   "with a 'side ... jobs/s' header (written by benchmarks/throughput.py)")
    return tuple(out)


def parse_scaling(text: str, path: str) -> tuple[Scaling, ...]:
    """``benchmarks/lightning_comparison/scaling.py``: wall time and final loss per side and machine count."""
    records = result_records(text, path, "scaling")
    _require(records, path, "scaling", "benchmarks/lightning_comparison/scaling.py")
    out = []
    for (case, _), recs in grouped(records, ("case", "machines")):
        machines = number(recs[0][1], "machines", path, recs[0][0])
        out.append(Scaling(case, int(machines), median_of(recs, "wall_s", path), median_of(recs, "loss", path, True)))
    return tuple(out)


def parse_locality(text: str, path: str) -> tuple[Locality, ...]:
    """``benchmarks/lightning_comparison/locality_run.py``: wall time of the 4-machine job per placement."""
    records = result_records(text, path, "locality")
    _require(records, path, "locality", "benchmarks/lightning_comparison/locality_run.py")
    out = []
    for (case,), recs in grouped(records, ("case",)):
        reasons = [r.get("reason", r.get("placement")) for _, r in recs]  # locality_run.py writes "placement"
        reasons = [r for r in reasons if isinstance(r, str)]
        out.append(Locality(case, median_of(recs, "wall_s", path), reasons[0] if reasons else None))
    return tuple(out)


# -- which file each kind lives in ------------------------------------------------------------------

@dataclass(frozen=True)
class LogKind:
    names: tuple[str, ...]                  # file names in a results folder, the preferred first
    writer: str                             # the script that writes it
    parse: Callable[[str, str], object]


KINDS = {
    "trainer": LogKind(("lightning_comparison.txt",), "benchmarks/lightning_comparison/bench.py",
                       parse_lightning_comparison),
    "scaling": LogKind(("scaling.txt",), "benchmarks/lightning_comparison/scaling.py", parse_scaling),
    # The bandwidth-bound run first: the default job's 0.1 MB/step does not feel the lab's rate limits.
    "locality": LogKind(("locality-hidden1024.txt", "locality.txt"), "benchmarks/lightning_comparison/locality_run.py",
                        parse_locality),
    "startup": LogKind(("startup.txt",), "benchmarks/startup.py", parse_startup),
    "placement": LogKind(("placement_scale.txt",), "benchmarks/placement_scale.py", parse_placement_scale),
    "throughput": LogKind(("throughput-ray.txt", "throughput.txt"), "benchmarks/throughput.py", parse_throughput),
}
