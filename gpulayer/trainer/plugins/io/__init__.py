"""Checkpoint IO plugins: how checkpoint files are written, read and removed (``strategy.checkpoint_io``)."""

from gpulayer.trainer.plugins.io.async_plugin import AsyncCheckpointIO
from gpulayer.trainer.plugins.io.checkpoint_io import CheckpointIO
from gpulayer.trainer.plugins.io.torch_io import TorchCheckpointIO

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO"]
