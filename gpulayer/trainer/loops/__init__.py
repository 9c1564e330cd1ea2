"""Names user code imports from Lightning's ``lightning.pytorch.loops`` (the loops themselves are ``loop.py``,
``evaluate.py`` and ``stepping.py``)."""

from gpulayer.trainer.loops.closure import Closure, ClosureResult

__all__ = ["Closure", "ClosureResult"]
