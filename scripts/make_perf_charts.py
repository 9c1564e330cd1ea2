"""Draw the performance page's charts (PNG) from the committed raw logs in ``benchmarks/results/``.

    python scripts/make_perf_charts.py --out /tmp/charts                  # every chart; a missing log: exit 2
    python scripts/make_perf_charts.py --out /tmp/charts --skip-missing   # what the logs allow; lists the rest
    python scripts/make_perf_charts.py --logs benchmarks/results/2026-12-01-vm --out /tmp/charts
    python scripts/make_perf_charts.py --logs trainer=benchmarks/results/2026-12-01-vm/lightning_comparison_ddp.txt ...

Each log is taken from the newest ``benchmarks/results/*-vm`` folder that has it, or from the folders given with
``--logs`` (searched in the order given); a file given with ``--logs`` is used for the chart its name belongs to,
``lightning_comparison_ddp.txt`` for ``lightning_comparison.txt``'s (or the one named with ``KIND=FILE``).
Every chart has a fixed file name and names its log in its footer; the same logs give the same bytes (Agg,
fixed fonts and sizes, no date or version in the PNG). A malformed log fails with its file and line (exit 1),
before any chart is written. Nothing is measured here: the figures are the logs'.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from perf_logs import KINDS, LogError, meta  # noqa: E402  (same folder)

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"

# Fixed look: matplotlib's defaults, then these; nothing from a matplotlibrc or the machine.
STYLE = {"font.family": "DejaVu Sans", "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10,
         "axes.grid": True, "grid.alpha": 0.3, "axes.axisbelow": True, "axes.spines.top": False,
         "axes.spines.right": False, "legend.frameon": False, "legend.fontsize": 9, "figure.dpi": 100,
         "savefig.dpi": 100, "svg.hashsalt": "gpulayer"}
COLORS = {"gpulayer": "#1565c0", "gpulayer-two-level": "#1565c0", "gpulayer-submit_batch": "#1565c0",
          "direct": "#1565c0", "gpulayer-flat": "#64b5f6", "gpulayer-delay": "#64b5f6", "direct-fresh": "#64b5f6",
          "lightning": "#8e24aa", "torchrun": "#8e24aa", "raw": "#9e9e9e", "celery": "#2e7d32", "ray": "#ef6c00",
          "one-zone": "#1565c0", "two-zones": "#64b5f6", "two-regions": "#8e24aa", "auto": "#2e7d32"}
FALLBACK = ("#455a64", "#c62828", "#6d4c41", "#00838f", "#f9a825", "#ad1457", "#558b2f")
LABELS = {"raw": "raw PyTorch loop", "lightning": "Lightning", "gpulayer": "gpulayer Trainer",
          "gpulayer-two-level": "gpulayer, two-level sync", "gpulayer-flat": "gpulayer, flat sync",
          "gpulayer-submit_batch": "gpulayer submit_batch", "gpulayer-delay": "gpulayer submit.delay",
          "celery": "plain Celery .delay", "ray": "Ray", "one-zone": "one zone", "two-zones": "two zones",
          "two-regions": "two regions", "auto": "gpulayer's choice", "direct": "direct (warm)",
          "direct-fresh": "direct (fresh)", "torchrun": "torchrun"}


def color(case: str, i: int = 0) -> str:
    return COLORS.get(case, FALLBACK[i % len(FALLBACK)])


def label(case: str) -> str:
    return LABELS.get(case, case)


def ordered(cases, known: tuple[str, ...]) -> list[str]:
    """The known cases in their fixed order, then any others in the log's order."""
    cases = list(dict.fromkeys(cases))
    return [c for c in known if c in cases] + [c for c in cases if c not in known]


@dataclass(frozen=True)
class Source:
    shown: str   # the log's path as the footer names it
    meta: str    # when it was written, the load it states

    def footer(self) -> str:
        return f"from {self.shown}" + (f" ({self.meta})" if self.meta else "")


def figure(title: str, source: Source, ncols: int = 1, width: float = 9.0, height: float = 5.0,
           bottom: float = 0.2) -> tuple[Figure, list]:
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    fig.text(0.01, 0.012, source.footer(), fontsize=7.5, color="#616161")
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.7 / height, bottom=bottom, wspace=0.28)
    return fig, list(axes[0])


def legend_below(ax, ncol: int = 2, offset: float = -0.14) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, offset), ncol=ncol, fontsize=7.5)


def bar_labels(ax, bars, fmt: str = "{:.2f}", fontsize: float = 8.0) -> None:
    ax.bar_label(bars, labels=[fmt.format(b.get_height()) for b in bars], padding=2, fontsize=fontsize)


def headroom(ax, factor: float = 1.15) -> None:
    """Room above the tallest bar for its value label."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * factor if ax.get_yscale() == "linear" else hi * factor ** 4)


# -- the charts ---------------------------------------------------------------------------------

def draw_trainer(cases, source: Source) -> Figure:
    fig, (ax,) = figure("Trainer: milliseconds per training step, side by side", source)
    sides = ("raw", "lightning", "gpulayer")
    width = 0.8 / len(sides)
    xs = range(len(cases))
    for i, side in enumerate(sides):
        values = [getattr(c, f"{side}_ms") for c in cases]
        bars = ax.bar([x + (i - 1) * width for x in xs], values, width, label=label(side), color=color(side))
        bar_labels(ax, bars)
    ax.set_xticks(list(xs), [textwrap.fill(c.name, 22) + f"\n{c.lightning_ms / c.gpulayer_ms:.2f}x vs Lightning"
                             for c in cases], fontsize=8.5)
    ax.set_ylabel("ms per step (lower is better)")
    ax.legend(loc="upper left")
    headroom(ax)
    return fig


def draw_scaling(rows, source: Source) -> Figure:
    fig, (ax, ratio_ax) = figure("One training job on more machines: gpulayer against Lightning + torchrun",
                                 source, ncols=2, width=12.0, height=5.5, bottom=0.25)
    cases = ordered([r.case for r in rows], ("gpulayer-two-level", "gpulayer-flat", "lightning"))
    machines = sorted({r.machines for r in rows})
    wall = {(r.case, r.machines): r.wall_s for r in rows}
    loss = {(r.case, r.machines): r.loss for r in rows if r.loss is not None}
    for i, case in enumerate(cases):
        pts = [(m, wall[(case, m)]) for m in machines if (case, m) in wall]
        last = max((m for c, m in loss if c == case), default=None)
        name = label(case) + (f" (final loss {loss[(case, last)]:.4g} at {last})" if last else "")
        ax.plot([m for m, _ in pts], [w for _, w in pts], "o-", color=color(case, i), label=name)
        for m, w in pts:
            ax.annotate(f"{w:.1f}", (m, w), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set(xlabel="simulated machines", ylabel="wall time, s (lower is better)", title="wall time, start to last exit")
    ax.set_xticks(machines)
    ax.set_ylim(bottom=0)
    headroom(ax)
    ax.legend(loc="upper left")
    base = "gpulayer-two-level" if "gpulayer-two-level" in cases else cases[0]
    for i, case in enumerate(c for c in cases if c != base):
        pts = [(m, wall[(case, m)] / wall[(base, m)]) for m in machines if (case, m) in wall and (base, m) in wall]
        ratio_ax.plot([m for m, _ in pts], [r for _, r in pts], "o-", color=color(case, i + 1),
                      label=f"{label(case)} / {label(base)}")
        for m, r in pts:
            ratio_ax.annotate(f"{r:.2f}x", (m, r), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ratio_ax.axhline(1.0, color="#616161", lw=0.8, ls=":")
    lo, hi = ratio_ax.get_ylim()
    ratio_ax.set_ylim(min(lo, 0.9), hi + (hi - min(lo, 0.9)) * 0.15)
    ratio_ax.set(xlabel="simulated machines", ylabel=f"wall time / {label(base)}",
                 title=f"ratio (above 1: {label(base)} is faster)")
    ratio_ax.set_xticks(machines)
    legend_below(ratio_ax, ncol=1)
    return fig


def draw_locality(rows, source: Source) -> Figure:
    fig, (ax,) = figure("The 4-machine job placed in one zone, two zones, two regions", source)
    cases = ordered([r.case for r in rows], ("one-zone", "two-zones", "two-regions", "auto"))
    by_case = {r.case: r for r in rows}
    bars = ax.bar(range(len(cases)), [by_case[c].wall_s for c in cases], 0.6,
                  color=[color(c, i) for i, c in enumerate(cases)])
    bar_labels(ax, bars, "{:.2f} s")
    ax.set_xticks(range(len(cases)), [label(c) for c in cases])
    ax.set_ylabel("wall time, s (lower is better)")
    if "one-zone" in by_case and "two-regions" in by_case:
        ax.set_title(f"two regions / one zone: {by_case['two-regions'].wall_s / by_case['one-zone'].wall_s:.2f}x")
    reasons = [f"{label(c)}: {by_case[c].reason}" for c in cases if by_case[c].reason]
    if reasons:
        ax.set_xlabel(textwrap.fill("; ".join(reasons), 110), fontsize=8.5)
    headroom(ax)
    return fig


def draw_startup(s, source: Source) -> Figure:
    fig, (ax, stage_ax) = figure("A tiny distributed job, submit to result: the direct launcher against torchrun",
                                 source, ncols=2, width=12.0, height=6.0, bottom=0.27)
    xs = range(len(s.variants))
    bars = ax.bar(xs, s.median_s, 0.6, color=[color(v, i) for i, v in enumerate(s.variants)], label="median")
    bar_labels(ax, bars, "{:.2f} s")
    for x, runs in zip(xs, s.runs_s):
        ax.plot([x + 0.36] * len(runs), runs, "o", color="#212121", ms=3.5, alpha=0.7,
                label="each run" if x == 0 and runs else None)
    ax.set_xticks(list(xs), [label(v) for v in s.variants])
    ax.set(ylabel="submit to result, s (lower is better)", title="median of the runs")
    if "direct" in s.variants and "torchrun" in s.variants:
        d, t = s.median_s[s.variants.index("direct")], s.median_s[s.variants.index("torchrun")]
        ax.set_title(f"median of the runs; torchrun / direct {t / d:.1f}x")
    ax.legend(loc="upper left")
    headroom(ax)
    if not s.stages:
        stage_ax.set_axis_off()
        stage_ax.text(0.5, 0.5, "the log has no stage breakdown", ha="center", va="center")
        return fig
    cmap = plt.get_cmap("viridis", len(s.stages))
    for i, v in enumerate(s.variants):
        prev = 0.0
        for k, (stage, offsets) in enumerate(s.stages):
            span = max(0.0, offsets[i] - prev)
            stage_ax.barh(i, span, left=prev, color=cmap(k), edgecolor="white", lw=0.5,
                          label=f"until {stage}" if i == 0 else None)
            prev = max(prev, offsets[i])
    stage_ax.set_yticks(list(xs), [label(v) for v in s.variants])
    stage_ax.invert_yaxis()
    stage_ax.set(xlabel="seconds after the distributed() call", title="where the time goes (medians)")
    legend_below(stage_ax)
    return fig


# The lines drawn (when the log has them), with their colours; "before" is drawn dashed in the same colour.
PLACEMENT_SERIES = {"route cpu": "#1565c0", "place_gang 16x4 cpu warm": "#c62828", "place_gang 64x8 cpu warm": "#ef6c00",
                    "place_gang 16x4 cpu cold": "#00838f"}
SNAPSHOT_SERIES = ("full read (Registry.read)", "refresh, nothing changed", "refresh after 1% changed busy counts",
                   "refresh after 10% changed busy counts", "refresh after 1% changed records")
GOAL_OF = {"route cpu": "route", "place_gang 16x4 cpu warm": "place_gang 16x4", "full read (Registry.read)":
           "full snapshot", "refresh after 1% changed busy counts": "incremental refresh"}


def draw_placement(p, source: Source) -> Figure:
    snapshot = [r for r in p.rows if r.what in SNAPSHOT_SERIES]
    fig, axes = figure("Placement cost against fleet size (median per call)", source,
                       ncols=2 if snapshot else 1, width=13.0 if snapshot else 9.0, height=6.5, bottom=0.3)
    goals = dict(p.goals_ms)
    ax = axes[0]
    series = [w for w in PLACEMENT_SERIES if any(r.what == w for r in p.rows)]
    if not series:
        raise LogError(source.shown, None, f"no placement rows named any of {list(PLACEMENT_SERIES)}")
    refused_any = False
    for what in series:
        rows = sorted((r for r in p.rows if r.what == what), key=lambda r: r.workers)
        placed = [r for r in rows if r.result in (None, "ok")]  # a gang too big for a small fleet costs nothing
        refused = [r for r in rows if r.result not in (None, "ok")]
        c = PLACEMENT_SERIES[what]
        ax.plot([r.workers for r in placed], [r.median_ms for r in placed], "o-", color=c, label=what)
        ax.plot([r.workers for r in refused], [r.median_ms for r in refused], "o", color=c, mfc="white")
        refused_any = refused_any or bool(refused)
        before = [r for r in placed if r.before_ms is not None]
        if before:
            ax.plot([r.workers for r in before], [r.before_ms for r in before], "x--", color=c, alpha=0.6,
                    label=f"{what}, before the index")
        if placed:
            ax.annotate(f"{placed[-1].median_ms:.3g} ms", (placed[-1].workers, placed[-1].median_ms),
                        textcoords="offset points", xytext=(5, -3), fontsize=7.5, color=c)
        if GOAL_OF.get(what) in goals:
            ax.axhline(goals[GOAL_OF[what]], color=c, lw=0.8, ls=":")
            ax.annotate(f"goal for {GOAL_OF[what]} at 10,000: {goals[GOAL_OF[what]]:g} ms",
                        (rows[0].workers, goals[GOAL_OF[what]]), textcoords="offset points", xytext=(0, 3),
                        fontsize=7.5, color=c)
    if refused_any:
        ax.plot([], [], "o", color="#616161", mfc="white", label="hollow: the gang does not fit (refused or waits)")
    ax.set(xscale="log", yscale="log", xlabel="workers in the snapshot (8 slots each)",
           ylabel="ms per call (log scale)", title="route and place_gang (pure, in one process)")
    legend_below(ax)
    if snapshot:
        _draw_snapshot(axes[1], snapshot, goals)
    return fig


def _draw_snapshot(ax, rows, goals: dict) -> None:
    sizes = sorted({r.workers for r in rows})
    whats = [w for w in SNAPSHOT_SERIES if any(r.what == w for r in rows)]
    cells = {(r.what, r.workers): r for r in rows}
    width = 0.8 / (len(whats) + 1)
    for k, size in enumerate(sizes):
        for i, what in enumerate(whats):
            r = cells.get((what, size))
            if r is None:
                continue
            bars = ax.bar(k + (i - len(whats) / 2) * width, r.median_ms, width, color=FALLBACK[i] if i else
                          COLORS["gpulayer"], label=what if k == 0 else None)
            bar_labels(ax, bars, "{:.3g}", fontsize=7)
            if what == whats[0] and r.before_ms is not None:
                bars = ax.bar(k + len(whats) / 2 * width, r.before_ms, width, color="#bdbdbd",
                              label=f"{what}, before" if k == 0 else None)
                bar_labels(ax, bars, "{:.3g}", fontsize=7)
    for what, style in zip((w for w in whats if GOAL_OF.get(w) in goals), (":", "-.")):
        ax.axhline(goals[GOAL_OF[what]], color="#616161", lw=0.9, ls=style,
                   label=f"goal for {GOAL_OF[what]} at 10,000: {goals[GOAL_OF[what]]:g} ms")
    ax.set_yscale("log")
    ax.set_xticks(range(len(sizes)), [f"{n:,} workers" for n in sizes])
    ax.set(ylabel="ms per call (log scale)", title="registry snapshot from a real Redis")
    headroom(ax)
    legend_below(ax, offset=-0.08)


def draw_throughput(rows, source: Source) -> Figure:
    cases = ordered([r.case for r in rows], ("gpulayer-submit_batch", "gpulayer-delay", "celery", "ray"))
    others = " and ".join(label(c).split(" .")[0] for c in cases if not c.startswith("gpulayer"))
    fig, (ax,) = figure("Tiny jobs: throughput end to end, gpulayer" + (f" against {others}" if others else ""), source)
    configs = list(dict.fromkeys(r.config for r in rows))
    rate = {(r.case, r.config): r.jobs_s for r in rows}
    width = min(0.8 / len(cases), 0.2)
    for i, case in enumerate(cases):
        pts = [(k, rate[(case, c)]) for k, c in enumerate(configs) if (case, c) in rate]
        bars = ax.bar([k + (i - (len(cases) - 1) / 2) * width for k, _ in pts], [v for _, v in pts], width,
                      color=color(case, i), label=label(case))
        bar_labels(ax, bars, "{:.0f}")
    ax.set_xticks(range(len(configs)), [f"{c} (workers x slots)" for c in configs])
    ax.set_xlim(-0.6, len(configs) - 0.4)
    ax.set_ylabel("jobs per second (higher is better)")
    ax.legend(loc="upper left", ncol=min(4, len(cases)))
    headroom(ax, 1.25)
    return fig


@dataclass(frozen=True)
class Chart:
    file: str
    kind: str                                   # a key of perf_logs.KINDS
    draw: Callable[[object, Source], Figure]


CHARTS = (
    Chart("trainer_ms_per_step.png", "trainer", draw_trainer),
    Chart("scaling.png", "scaling", draw_scaling),
    Chart("locality.png", "locality", draw_locality),
    Chart("startup.png", "startup", draw_startup),
    Chart("placement_cost.png", "placement", draw_placement),
    Chart("throughput.png", "throughput", draw_throughput),
)


# -- finding the logs and writing the files ---------------------------------------------------------

def shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def kind_of(name: str) -> str:
    """The chart kind a log file's name belongs to ('' if none): its own name, or a variant such as
    ``lightning_comparison_ddp.txt`` or ``startup-coordinator-after.txt``."""
    for kind, spec in KINDS.items():
        stems = [n.removesuffix(".txt") for n in spec.names]
        if name in spec.names or any(name.startswith((stem + "_", stem + "-")) for stem in stems):
            return kind
    return ""


def choose_logs(entries: list[str] | None) -> dict[str, Path]:
    """Chart kind -> log file: pinned files first, then each kind from the first folder that has it.

    Raises ValueError for an entry that is neither a folder nor a file of a known kind.
    """
    pinned: dict[str, Path] = {}
    folders: list[Path] = []
    for entry in entries or []:
        kind, _, file = entry.partition("=") if "=" in entry else ("", "", entry)
        path = Path(file)
        if kind and kind not in KINDS:
            raise ValueError(f"--logs {entry}: unknown chart kind {kind!r} (kinds: {', '.join(KINDS)})")
        if path.is_dir() and not kind:
            folders.append(path)
        elif path.is_file():
            kind = kind or kind_of(path.name)
            if not kind:
                raise ValueError(f"--logs {entry}: which chart is it for? Name it as KIND={file} "
                                 f"(kinds: {', '.join(KINDS)})")
            pinned[kind] = path
        else:
            raise ValueError(f"--logs {entry}: no such {'file' if kind else 'file or folder'}")
    if entries is None:
        folders = sorted((d for d in RESULTS.glob("*-vm") if d.is_dir()), reverse=True)  # newest date first
    found = dict(pinned)
    for kind, spec in KINDS.items():
        for folder in folders if kind not in found else ():
            hit = next((folder / n for n in spec.names if (folder / n).is_file()), None)
            if hit:
                found[kind] = hit
                break
    return found


def render(chart: Chart, data, source: Source, out: Path) -> Path:
    """Draw ``data`` (what the chart's parser returned) into ``out/chart.file``."""
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update(STYLE)
        fig = chart.draw(data, source)
        try:
            target = out / chart.file
            fig.savefig(target, format="png", metadata={"Software": None})  # no matplotlib version in the bytes
        finally:
            plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="charts: " + ", ".join(c.file for c in CHARTS))
    p.add_argument("--out", type=Path, required=True, help="folder for the PNG files (created if missing)")
    p.add_argument("--logs", nargs="+", metavar="DIR|FILE|KIND=FILE",
                   help="results folders to search, in order, and/or log files (default: every "
                        "benchmarks/results/*-vm folder, newest first)")
    p.add_argument("--skip-missing", action="store_true", help="draw the charts whose logs exist and list the rest")
    args = p.parse_args(argv)
    try:
        logs = choose_logs(args.logs)
    except ValueError as err:
        p.error(str(err))
    missing = [c for c in CHARTS if c.kind not in logs]
    for c in missing:
        spec = KINDS[c.kind]
        print(f"{'skipped' if args.skip_missing else 'missing'}: {c.file} needs {' or '.join(spec.names)}, "
              f"written by {spec.writer}", file=sys.stderr)
    if missing and not args.skip_missing:
        print("run those benchmarks (and commit their logs), point --logs at them, or pass --skip-missing",
              file=sys.stderr)
        return 2
    parsed = []
    for c in (c for c in CHARTS if c.kind in logs):  # every log is read before any chart is written
        text = logs[c.kind].read_text()
        try:
            parsed.append((c, KINDS[c.kind].parse(text, shown(logs[c.kind])), Source(shown(logs[c.kind]), meta(text))))
        except LogError as err:
            print(f"malformed log: {err}", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for c, data, source in parsed:
        try:
            print(f"{render(c, data, source, args.out)}  from {source.shown}")
        except LogError as err:  # a log that parses but lacks what its chart draws
            print(f"malformed log: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
