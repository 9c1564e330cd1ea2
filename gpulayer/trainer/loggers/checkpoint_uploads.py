"""Which of a ``ModelCheckpoint``'s files a hosted logger uploads, and when (its ``log_model`` argument).

Lightning's rule, shared by the W&B, MLflow and LitLogger loggers:

* ``log_model="all"``: each checkpoint as it is saved;
* ``log_model=True``: the checkpoints at the end of a successful run, except with ``save_top_k=-1``
  (every checkpoint is kept), when they go as they are saved too;
* ``log_model=False``: none.

A file is uploaded again only when it changed since (a ``last.ckpt`` rewritten in place).
"""

from __future__ import annotations

import os
from typing import Any

# the ModelCheckpoint settings recorded with an uploaded checkpoint, where the callback has them
CHECKPOINT_SETTINGS = ("monitor", "mode", "save_last", "save_top_k", "save_weights_only", "_every_n_train_steps")


def upload_now(log_model: bool | str, checkpoint_callback: Any) -> bool:
    """After a save: upload at once (``"all"``, or ``True`` with ``save_top_k == -1``)."""
    return log_model == "all" or (log_model is True and getattr(checkpoint_callback, "save_top_k", None) == -1)


def new_checkpoints(checkpoint_callback: Any, uploaded: dict[str, float]) -> list[tuple[float, str, Any, str]]:
    """``(mtime, path, score, tag)`` of the callback's files not uploaded yet (or changed since), oldest first.

    ``tag`` says which of its paths named the file: ``"latest"`` (``last_model_path``), ``"best"``
    (``best_model_path``) or ``"best_k"`` (``best_k_models``); ``uploaded`` maps path -> mtime when uploaded.
    """
    found: dict[str, tuple[Any, str]] = {}
    if hasattr(checkpoint_callback, "last_model_path") and hasattr(checkpoint_callback, "current_score"):
        found[checkpoint_callback.last_model_path] = (checkpoint_callback.current_score, "latest")
    if hasattr(checkpoint_callback, "best_model_path") and hasattr(checkpoint_callback, "best_model_score"):
        found[checkpoint_callback.best_model_path] = (checkpoint_callback.best_model_score, "best")
    for path, score in getattr(checkpoint_callback, "best_k_models", {}).items():
        found[path] = (score, "best_k")
    on_disk = sorted((os.stat(p).st_mtime, p, score, tag) for p, (score, tag) in found.items() if p and os.path.isfile(p))
    return [c for c in on_disk if c[1] not in uploaded or uploaded[c[1]] < c[0]]


def checkpoint_metadata(checkpoint_callback: Any, path: str, score: Any,
                        settings: tuple[str, ...] = CHECKPOINT_SETTINGS, group: str | None = None) -> dict[str, Any]:
    """What is recorded with an uploaded checkpoint: its score (a number, not a tensor), file name and the
    callback's settings under ``group`` (the callback's class name unless given)."""
    return {
        "score": score.item() if hasattr(score, "item") else score,
        "original_filename": os.path.basename(path),
        group or type(checkpoint_callback).__name__: {k: getattr(checkpoint_callback, k)
                                                      for k in settings if hasattr(checkpoint_callback, k)},
    }


def aliases_for(checkpoint_callback: Any, path: str) -> list[str]:
    """``["latest", "best"]`` for the callback's best file, ``["latest"]`` for any other."""
    return ["latest", "best"] if path == getattr(checkpoint_callback, "best_model_path", None) else ["latest"]
