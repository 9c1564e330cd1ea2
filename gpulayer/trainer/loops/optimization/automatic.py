"""Lightning's ``loops.optimization.automatic`` path: the closure of automatic optimization."""

from gpulayer.trainer.loops.closure import Closure, ClosureResult

__all__ = ["Closure", "ClosureResult"]
