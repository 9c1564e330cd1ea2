"""``AdvancedProfiler``: ``cProfile`` per action (``Trainer(profiler="advanced")``)."""

from __future__ import annotations

import cProfile
import contextlib
import io
import os
import pstats
from typing import Any

from gpulayer.trainer.profilers.profiler import Profiler


class AdvancedProfiler(Profiler):
    """``cProfile`` per action: the summary lists each action's functions by cumulative time.

    ``line_count_restriction`` limits the rows per action (a count, or a fraction of them);
    ``dump_stats=True`` also writes each action's raw stats next to the summary.
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None,
                 line_count_restriction: float = 1.0, dump_stats: bool = False) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats

    def start(self, action_name: str) -> None:
        # cProfile allows one active profiler per thread: a nested action is recorded in the outer one
        profiler = self.profiled_actions.setdefault(action_name, cProfile.Profile())
        with contextlib.suppress(ValueError):
            profiler.enable()

    def stop(self, action_name: str) -> None:
        profiler = self.profiled_actions.get(action_name)
        if profiler is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        profiler.disable()

    def summary(self) -> str:
        parts = []
        for action, profiler in self.profiled_actions.items():
            stream = io.StringIO()
            try:
                stats = pstats.Stats(profiler, stream=stream).strip_dirs().sort_stats("cumulative")
            except TypeError:  # never enabled: nothing was recorded
                continue
            if self.dump_stats and self.dirpath:
                os.makedirs(self.dirpath, exist_ok=True)
                stats.dump_stats(os.path.join(self.dirpath, self._prepare_filename(action, ".prof")))
            stats.print_stats(self.line_count_restriction)
            parts.append(f"Profile stats for: {action}{os.linesep}{stream.getvalue()}")
        return os.linesep.join(parts)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "profiled_actions": {}}  # cProfile objects do not pickle
