"""``TorchCheckpointIO``: ``torch.save`` / ``torch.load`` files; the default of every strategy, and the one
place a checkpoint file is written or read (``checkpoint.save``/``load`` call it)."""

from __future__ import annotations

import io
import os
import shutil
from typing import Any

import torch

from gpulayer.trainer.errors import CheckpointNotFound
from gpulayer.trainer.plugins.io.checkpoint_io import CheckpointIO


class TorchCheckpointIO(CheckpointIO):
    """Writes atomically (a crash mid-write never leaves a truncated file), reads onto the CPU."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError("`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg is not "
                            f"supported for `{type(self).__name__}`. Please implement your custom `CheckpointIO` to "
                            "define how you'd like to use `storage_options`.")
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        buf = io.BytesIO()  # serialise first, then write the bytes in one go
        torch.save(checkpoint, buf)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
        os.replace(tmp, path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise CheckpointNotFound(f"Checkpoint file not found: {path!r} (ckpt_path=...: pass an existing "
                                     "checkpoint file, 'last' or 'best')")
        # None: the whole file (a Trainer's checkpoint holds its loops' state besides tensors)
        return torch.load(path, map_location=map_location or "cpu", weights_only=bool(weights_only))

    def remove_checkpoint(self, path: Any) -> None:
        path = os.fspath(path)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
