"""``CheckpointIO``: how a checkpoint's dict reaches storage and comes back (Lightning's interface)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class CheckpointIO(ABC):
    """Save, load and remove checkpoint files; the strategy calls it (``strategy.checkpoint_io``)."""

    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Write ``checkpoint`` to ``path``."""

    @abstractmethod
    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Read the checkpoint at ``path``."""

    @abstractmethod
    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint at ``path``."""

    def teardown(self) -> None:
        """Called when the stage ends (an asynchronous writer waits for its writes here)."""
