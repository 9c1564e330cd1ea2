"""``LearningRateFinder``: the Tuner's learning-rate range test as a callback (Lightning's ``callbacks.lr_finder``).

When the fit starts it runs the test (as ``Tuner.lr_find``, on the loaders the fit was given, leaving the
random state as it was) and, with ``update_attr``, writes the
suggestion to the model's ``lr`` / ``learning_rate`` and to the optimizers the fit already made, so
the fit trains at it. ``optimal_lr`` is the ``LRFinder`` (``results``, ``suggestion()``, ``plot()``).
"""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.callbacks.callback import Callback


class LearningRateFinder(Callback):
    SUPPORTED_MODES = ("linear", "exponential")

    def __init__(self, min_lr: float = 1e-8, max_lr: float = 1, num_training_steps: int = 100,
                 mode: str = "exponential", early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                 attr_name: str = "") -> None:
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ValueError(f"`mode` should be either of {self.SUPPORTED_MODES}")
        self._min_lr, self._max_lr, self._num_training_steps = min_lr, max_lr, num_training_steps
        self._mode, self._early_stop_threshold = mode, early_stop_threshold
        self._update_attr, self._attr_name = update_attr, attr_name
        self.optimal_lr: Any = None

    def lr_find(self, trainer: Any, pl_module: Any) -> None:
        from gpulayer.trainer.tuner.tuning import Tuner
        train, val = trainer.loaders.fit_given if trainer.datamodule is None else (None, None)
        self.optimal_lr = Tuner(trainer).lr_find(
            pl_module, train_dataloaders=train, val_dataloaders=val, datamodule=trainer.datamodule,
            min_lr=self._min_lr, max_lr=self._max_lr, num_training=self._num_training_steps, mode=self._mode,
            early_stop_threshold=self._early_stop_threshold, update_attr=self._update_attr, attr_name=self._attr_name)
        lr = self.optimal_lr.suggestion() if self._update_attr and self.optimal_lr is not None else None
        if lr is not None:  # the fit's optimizers exist already (configure_optimizers ran): they take it too
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = lr
                    if "initial_lr" in group:
                        group["initial_lr"] = lr

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.lr_find(trainer, pl_module)
