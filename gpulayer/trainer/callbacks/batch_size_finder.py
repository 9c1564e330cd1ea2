"""``BatchSizeFinder``: the Tuner's batch-size search as a callback (Lightning's ``callbacks.batch_size_finder``).

At the start of the stage it runs in (fit, validate, test or predict) it searches, as
``Tuner.scale_batch_size`` does, and leaves the size found in the model's (or datamodule's)
``batch_size``; the stage then runs with it. Subclass it and call ``scale_batch_size`` from
another hook to search at other times (e.g. at some epochs).
"""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.callbacks.callback import Callback


class BatchSizeFinder(Callback):
    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                 batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192) -> None:
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ValueError(f"`mode` should be either of {self.SUPPORTED_MODES}")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"`margin` should be between 0 and 1. Found margin={margin}")
        self.optimal_batch_size: int | None = init_val
        self._mode, self._steps_per_trial, self._init_val = mode, steps_per_trial, init_val
        self._max_trials, self._batch_arg_name, self._margin, self._max_val = max_trials, batch_arg_name, margin, max_val

    def setup(self, trainer: Any, pl_module: Any, stage: str | None = None) -> None:
        from gpulayer.trainer.tuner.tuning import check_batch_size_search
        check_batch_size_search(trainer, pl_module, getattr(trainer, "datamodule", None), self._mode, self._margin,
                                self._batch_arg_name, method=stage)

    def scale_batch_size(self, trainer: Any, pl_module: Any, method: str = "fit") -> None:
        from gpulayer.trainer.tuner.tuning import Tuner
        self.optimal_batch_size = Tuner(trainer).scale_batch_size(
            pl_module, datamodule=trainer.datamodule, method=method, mode=self._mode,
            steps_per_trial=self._steps_per_trial, init_val=self._init_val, max_trials=self._max_trials,
            batch_arg_name=self._batch_arg_name, margin=self._margin, max_val=self._max_val)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.scale_batch_size(trainer, pl_module, "fit")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or trainer.state.fn != "validate":
            return
        self.scale_batch_size(trainer, pl_module, "validate")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self.scale_batch_size(trainer, pl_module, "test")

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self.scale_batch_size(trainer, pl_module, "predict")
