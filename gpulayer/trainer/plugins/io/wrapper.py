"""``_WrappingCheckpointIO``: a ``CheckpointIO`` that hands the file work to another one (its ``checkpoint_io``).

Built without one, it gets the strategy's default when the strategy takes it (``resolve``); wrappers may nest.
"""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.plugins.io.checkpoint_io import CheckpointIO


class _WrappingCheckpointIO(CheckpointIO):
    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        self._checkpoint_io = checkpoint_io
        self._base_checkpoint_io_configured = checkpoint_io is not None

    @property
    def checkpoint_io(self) -> CheckpointIO | None:
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO) -> None:
        if isinstance(self._checkpoint_io, _WrappingCheckpointIO):
            self._checkpoint_io.checkpoint_io = io  # the innermost wrapper takes it
        elif self._checkpoint_io is None:
            self._checkpoint_io = io
        self._base_checkpoint_io_configured = True

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self._base().save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._base().load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        self._base().remove_checkpoint(path)

    def teardown(self) -> None:
        if self._checkpoint_io is not None:
            self._checkpoint_io.teardown()

    def _base(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            raise RuntimeError(f"{type(self).__name__} wraps no CheckpointIO yet: pass one "
                               f"({type(self).__name__}(TorchCheckpointIO())) or give it to a Trainer, whose strategy "
                               "sets its default")
        return self._checkpoint_io


def resolve(io: CheckpointIO | None) -> CheckpointIO:
    """The strategy's checkpoint IO: ``io`` with every unconfigured wrapper given a ``TorchCheckpointIO``."""
    from gpulayer.trainer.plugins.io.torch_io import TorchCheckpointIO
    if io is None:
        return TorchCheckpointIO()
    inner = io
    while isinstance(inner, _WrappingCheckpointIO) and inner._checkpoint_io is not None:
        inner._base_checkpoint_io_configured = True
        inner = inner._checkpoint_io
    if isinstance(inner, _WrappingCheckpointIO):
        inner.checkpoint_io = TorchCheckpointIO()
    return io
