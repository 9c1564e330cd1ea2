"""``AsyncCheckpointIO``: checkpoints written on a background thread while training goes on.

The checkpoint is snapshot on the calling thread (every tensor cloned), so a step that updates the weights right
after ``save_checkpoint`` returns cannot change what is written. One writer thread keeps saves and removals in
order; ``load_checkpoint`` and ``teardown`` (the end of every stage) wait for the writes, and raise the first
error a write met.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


from gpulayer.trainer.plugins.io.checkpoint_io import CheckpointIO
from gpulayer.trainer.plugins.io.wrapper import _WrappingCheckpointIO
from gpulayer.trainer.prefetch import apply_to_tensors


class AsyncCheckpointIO(_WrappingCheckpointIO):
    """``Trainer(plugins=[AsyncCheckpointIO()])``: the strategy's checkpoint IO, asynchronously."""

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        super().__init__(checkpoint_io)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def _submit(self, fn: Any, *args: Any) -> None:
        if self._executor is None:  # again after a teardown: the next stage writes asynchronously too
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpulayer-ckpt")
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._pending.append(self._executor.submit(fn, *args))

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        snapshot = apply_to_tensors(checkpoint, lambda t: t.detach().clone())
        self._submit(self._base().save_checkpoint, snapshot, path, storage_options)

    def remove_checkpoint(self, path: Any) -> None:
        self._submit(self._base().remove_checkpoint, path)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._wait()
        return super().load_checkpoint(path, *args, **kwargs)

    def _wait(self) -> None:
        pending, self._pending = self._pending, []
        errors = [e for f in pending if (e := f.exception()) is not None]  # exception() waits for the write
        if errors:
            raise RuntimeError(f"AsyncCheckpointIO: {len(errors)} checkpoint write(s) failed") from errors[0]

    def teardown(self) -> None:
        try:
            self._wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            super().teardown()

    def __getstate__(self) -> dict[str, Any]:  # a Trainer's config travels to ranks: no thread with it
        state = dict(self.__dict__)
        state["_executor"], state["_pending"] = None, []
        return state


