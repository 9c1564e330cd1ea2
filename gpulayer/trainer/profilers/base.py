"""``PassThroughProfiler``: the Trainer's default, which records nothing (Lightning's ``profilers.base``)."""

from __future__ import annotations

from gpulayer.trainer.profilers.profiler import Profiler


class PassThroughProfiler(Profiler):
    """Records nothing: the Trainer's default, under which nothing is wrapped."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass
