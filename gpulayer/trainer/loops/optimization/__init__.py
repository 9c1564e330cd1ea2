"""Lightning's ``loops.optimization`` path for the automatic-optimization closure."""

from gpulayer.trainer.loops.closure import Closure, ClosureResult

__all__ = ["Closure", "ClosureResult"]
