"""``ThroughputMonitor``: batches, samples, items and FLOPs per second, logged while a stage runs.

Training logs once per optimizer step at ``log_every_n_steps`` (the effective batch, with its ``optimizer.step()``
time), at the Trainer's step, with ``epoch``; validation, test and predict log at their own batch count, which goes
on across runs of one Trainer. Keys are ``{stage}{sep}time``, ``{stage}{sep}device{sep}samples_per_sec``...
(``Throughput``). Time spent validating inside a fit is taken out of the training time. Global rank 0 only.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.callbacks.log_steps import eval_log_due, is_stepping_batch, step_at_train_batch_end, train_log_due
from gpulayer.trainer.states import RunningStage
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn
from gpulayer.trainer.utilities.throughput import Throughput, compute_dtype, get_available_flops

_SETUP_STAGE = {"fit": RunningStage.TRAINING, "validate": RunningStage.VALIDATING, "test": RunningStage.TESTING,
                "predict": RunningStage.PREDICTING}


class ThroughputMonitor(Callback):
    """Log throughput with ``Throughput``.

    ``batch_size_fn(batch)``: the samples in a batch; ``length_fn(batch)``: the items in them (tokens, say),
    optional; other keyword arguments go to ``Throughput`` (``window_size``, ``separator``). The module's
    ``flops_per_batch`` attribute, when it has one (``measure_flops`` computes it), gives the FLOPs rates and
    the MFU on devices whose peak is known::

        trainer = Trainer(callbacks=ThroughputMonitor(batch_size_fn=lambda batch: batch.size(0)))
    """

    def __init__(self, batch_size_fn: Callable[[Any], int], length_fn: Callable[[Any], int] | None = None,
                 **kwargs: Any) -> None:
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.kwargs = kwargs
        self.available_flops: int | None = None
        self._throughputs: dict[RunningStage, Throughput] = {}
        self._t0s: dict[RunningStage, float] = {}
        self._lengths: dict[RunningStage, int] = {}
        self._samples: dict[RunningStage, int] = {}
        self._batches: dict[RunningStage, int] = {}
        self._eval_steps: dict[tuple[str, RunningStage], int] = {}  # batches of a stage over the Trainer's runs: its log step
        self._run_batches: dict[RunningStage, int] = {}  # batches of the current run: when to log
        self._trainer_id: int | None = None
        self._world_size = 1
        self._module_has_flops: bool | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._trainer_id != id(trainer):
            self._trainer_id, self._eval_steps = id(trainer), {}
        self.available_flops = get_available_flops(trainer.strategy.root_device, compute_dtype(trainer.precision))
        self._world_size = trainer.world_size
        self._throughputs[_SETUP_STAGE[stage]] = self._new_throughput()
        if stage == "fit":  # its validation gets a fresh one when it first runs (known once the loaders are)
            self._throughputs.pop(RunningStage.VALIDATING, None)

    def _new_throughput(self) -> Throughput:
        return Throughput(available_flops=self.available_flops, world_size=self._world_size, **self.kwargs)

    # -- the stages ------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, *_: Any) -> None:
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.TRAINING)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not trainer.is_global_zero:
            return
        self._update(pl_module, batch, RunningStage.TRAINING, trainer)
        if not is_stepping_batch(trainer, batch_idx):
            return  # inside an accumulation window: the optimizer has not stepped
        step = step_at_train_batch_end(trainer, batch_idx)
        if train_log_due(trainer, step):
            metrics = self._throughputs[RunningStage.TRAINING].compute()
            self._log(trainer, RunningStage.TRAINING, metrics, step, {"epoch": trainer.current_epoch})

    def on_validation_start(self, trainer: Any, *_: Any) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._start(trainer, RunningStage.VALIDATING)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *_: Any) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._eval_batch_end(trainer, pl_module, batch, RunningStage.VALIDATING)

    def on_validation_end(self, trainer: Any, *_: Any) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        # move the training clock's origin past the validation, so training rates exclude it
        train, val = self._throughputs[RunningStage.TRAINING], self._throughputs[RunningStage.VALIDATING]
        train_elapsed = train._time[-1] if train._time else 0.0
        val_elapsed = val._time[-1] if val._time else 0.0
        gap = self._t0s[RunningStage.VALIDATING] - (self._t0s[RunningStage.TRAINING] + train_elapsed)
        self._t0s[RunningStage.TRAINING] += gap + val_elapsed

    def on_test_start(self, trainer: Any, *_: Any) -> None:
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.TESTING)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *_: Any) -> None:
        if trainer.is_global_zero:
            self._eval_batch_end(trainer, pl_module, batch, RunningStage.TESTING)

    def on_predict_start(self, trainer: Any, *_: Any) -> None:
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.PREDICTING)

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, *_: Any) -> None:
        if trainer.is_global_zero:
            self._eval_batch_end(trainer, pl_module, batch, RunningStage.PREDICTING)

    # -- the counting ----------------------------------------------------------------------------
    def _start(self, trainer: Any, stage: RunningStage) -> None:
        # a fit starts its stages afresh each time; validate/test/predict go on counting across calls
        if stage not in self._throughputs:
            self._throughputs[stage] = self._new_throughput()
        if trainer.state.fn == "fit" or stage not in self._samples:
            self._throughputs[stage].reset()
            self._lengths[stage] = self._samples[stage] = self._batches[stage] = 0
        self._run_batches[stage] = 0
        self._t0s[stage] = time.perf_counter()

    @torch.inference_mode()  # batch_size_fn / length_fn may compute on tensors
    def _update(self, pl_module: Any, batch: Any, stage: RunningStage, trainer: Any) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # the clock reads the work done, not the work queued
        elapsed = time.perf_counter() - self._t0s[stage]
        if self.length_fn is not None:
            self._lengths[stage] += self.length_fn(batch)
        if self._module_has_flops is None:
            self._module_has_flops = hasattr(pl_module, "flops_per_batch")
            if not self._module_has_flops:
                rank_zero_warn("When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute "
                               f"or property in {type(pl_module).__name__} to compute the FLOPs.")
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        self._throughputs[stage].update(
            time=elapsed, batches=self._batches[stage], samples=self._samples[stage],
            lengths=None if self.length_fn is None else self._lengths[stage],
            flops=pl_module.flops_per_batch if self._module_has_flops else None)

    def _eval_batch_end(self, trainer: Any, pl_module: Any, batch: Any, stage: RunningStage) -> None:
        self._update(pl_module, batch, stage, trainer)
        self._run_batches[stage] = self._run_batches.get(stage, 0) + 1
        key = (str(trainer.state.fn), stage)  # a fit's validation counts apart from trainer.validate()'s
        self._eval_steps[key] = step = self._eval_steps.get(key, 0) + 1
        if eval_log_due(trainer, self._run_batches[stage] - 1):
            self._log(trainer, stage, self._throughputs[stage].compute(), step, {})

    def _log(self, trainer: Any, stage: RunningStage, metrics: dict[str, Any], step: int, extra: dict) -> None:
        sep = self._throughputs[stage].separator
        metrics = {**{f"{stage.value}{sep}{k}": v for k, v in metrics.items()}, **extra}
        for logger in trainer.loggers:
            logger.log_metrics(metrics=metrics, step=step)
            logger.save()
