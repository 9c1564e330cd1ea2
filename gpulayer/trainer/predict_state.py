"""What a predict run shows its prediction writers (Lightning's ``trainer.predict_loop``).

``trainer.predict_loop`` holds, during ``Trainer.predict``: ``predictions`` (every batch's output so far;
a list per loader when there are several), ``current_batch_indices`` (the dataset indices of the batch
just predicted) and ``epoch_batch_indices`` (per loader, per batch). Predictions are kept when the call
returns them or when a writer writes at the epoch end; indices only when a ``BasePredictionWriter`` is
attached: each loader is then rebuilt around a batch sampler that records the indices it hands out.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, IterableDataset


class _RecordingBatchSampler:
    """A batch sampler that remembers the index lists it gave, in order (``seen_batch_indices[batch_idx]``)."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler
        self.seen_batch_indices: list[list[int]] = []

    def __iter__(self):
        self.seen_batch_indices = []
        for indices in self.batch_sampler:
            self.seen_batch_indices.append(list(indices))
            yield indices

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __getattr__(self, name: str) -> Any:  # sampler, batch_size, drop_last: the wrapped sampler's
        if name == "batch_sampler":
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)


def _recording(loader: Any) -> tuple[Any, _RecordingBatchSampler | None]:
    """``loader`` rebuilt to record its batch indices; as it is (and None) when they cannot be known."""
    if type(loader) is not DataLoader or loader.batch_sampler is None or isinstance(loader.dataset, IterableDataset):
        return loader, None
    recorder = _RecordingBatchSampler(loader.batch_sampler)
    kwargs: dict[str, Any] = dict(
        batch_sampler=recorder, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        persistent_workers=loader.persistent_workers, generator=loader.generator)
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    return DataLoader(loader.dataset, **kwargs), recorder


class PredictState:
    """One predict run's outputs and batch indices (``trainer.predict_loop``)."""

    def __init__(self, callbacks: list, loaders: list, return_predictions: bool) -> None:
        from gpulayer.trainer.callbacks.prediction_writer import BasePredictionWriter
        writers = [c for c in callbacks if isinstance(c, BasePredictionWriter)]
        self.return_predictions = return_predictions
        self.keep = return_predictions or any(w.interval.on_epoch for w in writers)
        self.current_batch_indices: list[int] = []
        self.epoch_batch_indices: list[list[list[int]]] = [[] for _ in loaders]
        self._predictions: list[list] = [[] for _ in loaders]
        pairs = [_recording(dl) for dl in loaders] if writers else [(dl, None) for dl in loaders]
        self.loaders = [dl for dl, _ in pairs]
        self._recorders = [rec for _, rec in pairs]

    @property
    def predictions(self) -> list:
        """The predictions so far: one loader's list, or a list per loader."""
        if not self._predictions:
            return []
        return self._predictions[0] if len(self._predictions) == 1 else self._predictions

    def batch_done(self, dl_idx: int, batch_idx: int) -> None:
        """Before ``on_predict_batch_end``: the indices of the batch just predicted."""
        recorder = self._recorders[dl_idx]
        if recorder is None or batch_idx >= len(recorder.seen_batch_indices):
            return
        indices = recorder.seen_batch_indices[batch_idx]
        self.current_batch_indices = indices
        self.epoch_batch_indices[dl_idx].append(indices)

    def keep_output(self, dl_idx: int, output: Any) -> None:
        if self.keep:
            self._predictions[dl_idx].append(output)

    def result(self) -> Any:
        """What ``Trainer.predict`` returns; what was kept only for writers is let go."""
        out = self.predictions if self.return_predictions else None
        if not self.return_predictions:
            self._predictions = []
        self.epoch_batch_indices = []
        return out
