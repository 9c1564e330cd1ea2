"""``SimpleProfiler``: the wall time of every action (``Trainer(profiler="simple")``)."""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict

from gpulayer.trainer.profilers.profiler import Profiler


class SimpleProfiler(Profiler):
    """The wall time of each action, per call: ``recorded_durations[action]`` is a list of seconds.

    ``extended=True`` adds each action's share of the whole run to the summary.
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None,
                 extended: bool = True) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        began = self.current_actions.pop(action_name, None)
        if began is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        self.recorded_durations[action_name].append(end - began)

    def _make_report(self) -> list[tuple[str, float, float]]:
        """``(action, mean, total)`` per action, the slowest on average first."""
        rows = []
        for action, durations in self.recorded_durations.items():
            spent = math.fsum(durations)  # many tiny durations add up without losing precision
            rows.append((action, spent / len(durations), spent))
        return sorted(rows, key=lambda r: r[1], reverse=True)

    def _make_report_extended(self) -> tuple[list[tuple[str, float, int, float, float]], int, float]:
        """``(action, mean, calls, total, % of the run)`` per action, the largest share first; all calls; the run's time."""
        run_time = time.perf_counter() - self.start_time
        rows = []
        for action, durations in self.recorded_durations.items():
            spent = math.fsum(durations)
            rows.append((action, spent / len(durations), len(durations), spent,
                         100.0 * spent / run_time if run_time > 0 else 0.0))
        rows.sort(key=lambda r: r[4], reverse=True)
        return rows, sum(r[2] for r in rows), run_time

    def summary(self) -> str:
        """Lightning's table (tab-separated columns, so a report reads the same from either)."""
        if not self.recorded_durations:
            return ""
        sep = os.linesep
        widths = [max(len(a) for a in self.recorded_durations)] + [15] * (4 if self.extended else 2)

        def row(*cells: str) -> str:
            return sep + "".join(f"|  {cell:<{w}}\t" for cell, w in zip(cells, widths)) + "|"

        if self.extended:
            head = row("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            rows, calls, run_time = self._make_report_extended()
            body = [row(a, f"{m:.5}", f"{n}", f"{t:.5}", f"{p:.5}") for a, m, n, t, p in rows]
            total = [row("Total", "-", f"{calls}", f"{run_time:.5}", "100 %")]
        else:
            head = row("Action", "Mean duration (s)", "Total time (s)")
            body = [row(a, f"{m:.5}", f"{t:.5}") for a, m, t in self._make_report()]
            total = []
        line = sep + "-" * len(head.expandtabs())
        title = f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"
        parts = [title + sep, line, head, line]
        if total:
            parts += [*total, line]
        return "".join(parts + body + [line, sep])
