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
        self.start_time = time.monotonic()

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

    def summary(self) -> str:
        if not self.recorded_durations:
            return ""
        # math.fsum: many tiny durations add up without losing precision
        rows = sorted(((a, math.fsum(d) / len(d), len(d), math.fsum(d)) for a, d in self.recorded_durations.items()),
                      key=lambda r: r[3], reverse=True)
        total = time.monotonic() - self.start_time
        width = max(len("Action"), *(len(r[0]) for r in rows))
        head = f"{'Action':<{width}}  | Mean duration (s) | Num calls | Total time (s)"
        if self.extended:
            head += " | Percentage %"
        title = f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"
        lines = [title, "", head, "-" * len(head)]
        if self.extended:
            lines.append(f"{'Total':<{width}}  | {'-':>17} | {sum(r[2] for r in rows):>9} | {total:>14.5g} | {100:>12}")
        for action, mean, calls, spent in rows:
            line = f"{action:<{width}}  | {mean:>17.5g} | {calls:>9} | {spent:>14.5g}"
            if self.extended:
                line += f" | {100 * spent / total if total > 0 else 0:>12.4g}"
            lines.append(line)
        return os.linesep.join(lines)
