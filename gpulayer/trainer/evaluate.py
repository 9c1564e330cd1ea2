"""Validation, test and predict: one pass over the stage's loaders, with Lightning's hooks and results.

Used by ``Trainer.validate / test / predict`` and by the fit loop for its
validation (and the sanity check). The hook order is Lightning's
(``loops/evaluation_loop.py``, ``loops/prediction_loop.py``): ``on_<stage>_start``,
``on_<stage>_epoch_start``, per batch ``on_<stage>_batch_start`` / step /
``on_<stage>_batch_end``, ``on_<stage>_epoch_end``, then the epoch values are
reduced (what ``callback_metrics`` shows from here on), ``on_<stage>_end``.
"""

from __future__ import annotations

import inspect
import itertools
import math
from typing import Any

import torch

from gpulayer.trainer import data, dataloader_iter, metrics, profilers, trainer_logging
from gpulayer.trainer.predict_state import PredictState
from gpulayer.trainer.prefetch import device_batches
from gpulayer.trainer.states import RunningStage, TrainerFn
from gpulayer.trainer.plugins.precision.precision import converts_input
from gpulayer.trainer.plugins.precision.precision import step_context as precision_step_context
from gpulayer.trainer.stepping import transfer_batch
from gpulayer.trainer.utilities.model_helpers import is_overridden

# stage -> (hook prefix, step method, metric accumulator, Trainer limit attribute)
STAGES = {
    "validate": ("validation", "validation_step", "val", "limit_val_batches"),
    "test": ("test", "test_step", "test", "limit_test_batches"),
    "predict": ("predict", "predict_step", None, "limit_predict_batches"),
}


def dataloader_suffix(idx: int) -> str:
    return f"/dataloader_idx_{idx}"


class EvalLoop:
    """Run one stage over ``loaders``; ``run()`` returns per-loader metric dicts (or predictions)."""

    def __init__(self, trainer, module, stage: str, loaders: list, *, sanity: bool = False,
                 return_predictions: bool = True, verbose: bool = False):
        self.trainer, self.module, self.stage, self.loaders = trainer, module, stage, loaders
        self.prefix, self.step_name, self.acc_name, limit_name = STAGES[stage]
        self.limit = getattr(trainer.config, limit_name)
        self.sanity, self.return_predictions, self.verbose = sanity, return_predictions, verbose

    def _num_batches(self, loader: Any) -> float:
        cfg = self.trainer.config
        n = data.num_batches(loader, self.limit)
        if self.sanity:
            n = n if cfg.num_sanity_val_steps == -1 else min(n, cfg.num_sanity_val_steps)
        return n

    def run(self) -> list:
        # the whole stage, its start and end hooks too, runs without gradients (Lightning's loops do); a fit's
        # validation under no_grad only, as Lightning's: a tensor its hooks make (a pruning mask) trains after it
        inference = self.trainer.config.inference_mode and self.trainer.state.fn != TrainerFn.FITTING
        with torch.inference_mode() if inference else torch.no_grad():
            return self._run()

    def _run(self) -> list:
        t, module, hooks, store, p = self.trainer, self.module, self.trainer.hooks, self.trainer.metric_store, self.prefix
        modes = {name: m.training for name, m in module.named_modules()}  # restored at the end, submodule by submodule
        saved_context = store.context
        store.context = store.context_for(self.acc_name)
        stage_before = t.state.stage  # a fit's validation runs inside its training stage and returns to it
        t.state.stage = RunningStage.SANITY_CHECKING if self.sanity else RunningStage(self.stage)
        if self.sanity:
            hooks.call("on_sanity_check_start")
            if callable(self.loaders):  # a fit's val loaders, requested inside its sanity check (Lightning's order)
                self.loaders = self.loaders()
            if not any(self._num_batches(dl) for dl in self.loaders):  # no batch to check: Lightning skips the loop
                hooks.call("on_sanity_check_end")
                t.state.stage, store.context = stage_before, saved_context
                return []
        step = getattr(module, self.step_name)
        pulls_batches = dataloader_iter.takes_iterator(step, self.step_name)
        self._check_dataloader_idx()
        getattr(module, f"on_{p}_model_eval")()
        hooks.call(f"on_{p}_start")
        hooks.call(f"on_{p}_epoch_start")
        multi = len(self.loaders) > 1
        with_idx = dataloader_iter.takes_batch_idx(step)
        predicting = self.stage == "predict"
        loaders = self.loaders
        if predicting:  # what prediction writers read (trainer.predict_loop)
            t.predict_loop = PredictState(t.callbacks, loaders, self.return_predictions)
            loaders = t.predict_loop.loaders
        profiler = t.profiler
        prec = t.precision_plugin
        convert = prec.convert_input if converts_input(prec) else None
        step_context = precision_step_context(prec, self.stage)
        step = profilers.wrapper(profiler)(step, f"[Strategy]{type(t.strategy).__name__}.{self.step_name}")
        fetch = "[_PredictionLoop].predict_next" if predicting else f"[_EvaluationLoop].{self.acc_name}_next"
        if pulls_batches:  # the step takes `dataloader_iter`: it pulls its batches itself
            dataloader_iter.run_eval(self, step)
        for dl_idx, loader in enumerate(loaders if not pulls_batches else []):
            n = self._num_batches(loader)
            if n == 0:
                continue
            store.dl_idx = dl_idx if multi else None
            extra = (dl_idx,) if multi else ()
            data.set_epoch(loader, t.current_epoch)
            device = t.strategy.root_device
            it = data.batches_of(loader)
            it = profilers.timed(it, profiler, fetch)
            if n != math.inf:  # no batch past the limit is fetched (nor timed)
                it = itertools.islice(it, int(n))
            batches = it if hooks.transfer else device_batches(it, device, t.config.prefetch)
            for i, batch in enumerate(batches):
                if i >= n:
                    break
                if hooks.transfer:
                    batch = transfer_batch(hooks, batch, device, dl_idx)
                store.batch = batch
                if predicting:
                    t.predict_loop.batch_done(dl_idx, i)
                hooks.call(f"on_{p}_batch_start", batch, i, *extra)
                if convert is not None:
                    batch = convert(batch)
                with step_context():
                    out = step(batch, i, *extra) if with_idx else step(batch, *extra)
                hooks.call(f"on_{p}_batch_end", out, batch, i, *extra)
                if predicting:
                    t.predict_loop.keep_output(dl_idx, out)
                if not self.sanity and self.acc_name is not None:
                    trainer_logging.log_eval_step_metrics(t, self.acc_name)
            store.dl_idx = None
        if self.stage == "predict":
            hooks.call("on_predict_epoch_end")
            results = t.predict_loop.result()
            hooks.call("on_predict_end")
            self._restore_mode(modes)
        else:
            hooks.call(f"on_{p}_epoch_end")
            if self.sanity:
                store.discard_sanity(self.acc_name)  # Lightning discards what the sanity check logged
                results = []
            else:
                outputs = store.eval_outputs(self.acc_name, len(self.loaders))
                merged = {k: v for out in outputs for k, v in out.items()}
                floats = dict(zip(merged, metrics.to_floats(list(merged.values()))))
                results = [{k: floats[k] for k in out} for out in outputs]
                trainer_logging.log_epoch_metrics(t, floats)
            hooks.call(f"on_{p}_end")
        self._restore_mode(modes)
        if self.sanity:
            hooks.call("on_sanity_check_end")
        t.state.stage = stage_before
        store.context = saved_context
        if self.verbose and results and t.is_global_zero and self.stage != "predict":
            print_results(results, self.stage)
        return results

    def _check_dataloader_idx(self) -> None:
        """Lightning's rule: ``dataloader_idx`` is required with several loaders and must default with one."""
        multi, kind = len(self.loaders) > 1, {"validate": "val"}.get(self.stage, self.stage)
        for name in (self.step_name, f"on_{self.prefix}_batch_start", f"on_{self.prefix}_batch_end"):
            try:
                params = inspect.signature(getattr(self.module, name)).parameters
            except (TypeError, ValueError):
                continue
            if "dataloader_iter" in params:  # the iterator flavour picks its loaders itself
                continue
            idx = params.get("dataloader_idx")
            if not multi and idx is not None and idx.default is inspect.Parameter.empty:
                raise RuntimeError(
                    f"You provided only a single `{kind}_dataloader`, but have included `dataloader_idx` in "
                    f"`{type(self.module).__name__}.{name}()`. Either remove the argument or give it a default value "
                    "i.e. `dataloader_idx=0`.")
            if multi and idx is None and not any(p.kind == p.VAR_POSITIONAL for p in params.values()):
                raise RuntimeError(
                    f"You provided multiple `{kind}_dataloader`, but no `dataloader_idx` argument in "
                    f"`{type(self.module).__name__}.{name}()`. Try adding `dataloader_idx=0` to its signature.")

    def _restore_mode(self, modes: dict[str, bool]) -> None:
        """``on_<stage>_model_train`` when the module overrides it, else every submodule's mode as it was before.

        A submodule the user froze with ``.eval()`` stays in eval, as in Lightning (predict always restores).
        """
        hook = f"on_{self.prefix}_model_train"
        if self.stage != "predict" and is_overridden(hook, self.module):
            getattr(self.module, hook)()
            return
        for name, m in self.module.named_modules():
            if name in modes:
                m.training = modes[name]


def print_results(results: list[dict[str, float]], stage: str) -> None:
    """A short table of the stage's metrics (rank 0), as Lightning prints after validate/test."""
    names = sorted({k for r in results for k in r})
    if not names:
        return
    width = max(len(n) for n in names + [f"{stage} metric"]) + 2
    cols = [f"DataLoader {i}" for i in range(len(results))]
    line = "-" * (width + 16 * len(cols))
    print(line)
    print(f"{stage.capitalize() + ' metric':<{width}}" + "".join(f"{c:>16}" for c in cols))
    print(line)
    for n in names:
        print(f"{n:<{width}}" + "".join(f"{r[n]:>16.6g}" if n in r else f"{'':>16}" for r in results))
    print(line)


def defines(module: Any, name: str) -> bool:
    """The module overrides hook ``name`` (a class override, or an instance attribute that is not None)."""
    from gpulayer.trainer.module import Module
    if name in vars(module):
        return vars(module)[name] is not None
    impl = getattr(type(module), name, None)
    return impl is not None and impl is not getattr(Module, name, None)


def check_step(stage: str, module: Any) -> None:
    """Lightning's check before a stage runs: the module defines the step it needs."""
    from gpulayer.trainer.errors import TrainerConfigError
    from gpulayer.trainer.module import Module

    _, step_name, _, _ = STAGES[stage]
    overridden = defines(module, step_name)
    if stage == "predict":
        if module.predict_step is None:
            raise TrainerConfigError("`predict_step` cannot be None to run `Trainer.predict`")
        if not overridden and type(module).forward is Module.forward:
            raise TrainerConfigError("`Trainer.predict` requires `forward` method to run; define forward() or predict_step()")
    elif not overridden:
        raise TrainerConfigError(f"No `{step_name}()` method defined to run `Trainer.{stage}`; define {step_name}(self, batch, batch_idx)")
