"""The fit loop. The per-step code is meant to read like nanoGPT's training loop.

Per step: forward under the precision context, backward, (clip), step, zero
grads, count. Nothing syncs with the device per step: logged values stay
tensors until ``log_every_n_steps``; hooks nobody overrides are empty lists.

That inline step is the fast path. A module that overrides a hook with a default
behaviour (``optimizer_step``, ``backward``, the batch transfer...) runs each batch
through ``stepping.GeneralStep`` instead, which calls every hook in Lightning's
order; the choice is made once per fit (``Hooks.general``).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Mapping

import torch

from gpulayer.trainer import data
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.evaluate import EvalLoop
from gpulayer.trainer.prefetch import device_batches
from gpulayer.trainer.stepping import GeneralStep, _loss_of, transfer_batch
from gpulayer.trainer.progress import ProgressBar
from gpulayer.trainer.seed import capture_rng, restore_rng


def batch_output(out: Any, accum: int, manual: bool) -> dict:
    """What ``on_train_batch_end`` receives, as in Lightning: ``{"loss": detached loss, **other keys}`` (``{}``: skipped)."""
    if manual:
        if isinstance(out, Mapping):
            extra = dict(out)
        elif isinstance(out, torch.Tensor):
            extra = {"loss": out}
        elif out is None:
            extra = {}
        else:
            raise MisconfigurationException(
                "In manual optimization, `training_step` must either return a Tensor or have no return.")
        if "loss" in extra and isinstance(extra["loss"], torch.Tensor):
            extra["loss"] = extra["loss"].detach()
        return extra
    loss = _loss_of(out)
    if loss is None:
        return {}
    extra = {k: v for k, v in out.items() if k != "loss"} if isinstance(out, Mapping) else {}
    return {"loss": (loss / accum if accum > 1 else loss).detach().clone(), **extra}


def _needs_closure(optimizer: Any) -> bool:
    """``optimizer.step`` requires a closure (LBFGS): the fast loop, which steps without one, cannot drive it."""
    try:
        closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


class FitLoop:
    def __init__(self, trainer, module, step_fn, train_loader, val_loaders, resume: dict | None):
        cfg = trainer._config
        self.trainer, self.module, self.step_fn, self.cfg = trainer, module, step_fn, cfg
        self.strategy, self.precision, self.hooks, self.store = trainer.strategy, trainer._precision, trainer._hooks, trainer._store
        self.train_loader, self.val_loaders = train_loader, val_loaders
        self.resume = resume
        self.num_train_batches = data.num_batches(train_loader, cfg.limit_train_batches)
        self.batches_done = 0
        self.batch_idx = -1  # the batch being trained on (``trainer.is_last_batch``); kept after the epoch ends
        self._batches_before = 0  # train batches of the epochs before this one
        self.epoch_done = False
        self.epoch_start_rng: dict | None = None
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        # under manual optimization the user steps the schedulers (Lightning never does)
        scheds = trainer.lr_scheduler_configs if module.automatic_optimization else []
        self.step_schedulers = [c for c in scheds if c.interval == "step"]
        self.epoch_schedulers = [c for c in scheds if c.interval == "epoch"]
        self.log_needed = trainer.logger is not None or cfg.enable_progress_bar
        # decided once per fit: the general path calls every step hook in Lightning's order (stepping.py)
        # (and for an optimizer that must call the closure itself, like LBFGS)
        self.general = self.hooks.general or (module.automatic_optimization and _needs_closure(self.optimizer))
        self.general_step = GeneralStep(self)
        self.bar = ProgressBar() if cfg.enable_progress_bar and trainer.is_global_zero else None

    # -- fit --------------------------------------------------------------------------------
    def run(self) -> None:
        t, cfg = self.trainer, self.cfg
        if self.val_loaders and cfg.num_sanity_val_steps != 0 and self.resume is None:
            self.run_validation(sanity=True)
        self.hooks.call("on_train_start")
        if self.resume is not None and self.resume["epoch_done"]:
            t.current_epoch = self.resume["epoch"] + 1
            if self.resume["rng"] is not None:
                restore_rng(self.resume["rng"])
            self.resume = None
        elif self.resume is not None:
            t.current_epoch = self.resume["epoch"]
        while not self._fit_done():
            self.run_epoch()
            if self.epoch_done:
                t.current_epoch += 1
            else:
                break  # max_steps or should_stop (a Timer's max_time too) ended the epoch early
            if t.should_stop and self._can_stop_early(t.current_epoch):
                break
        self.hooks.call("on_train_end")

    def _can_stop_early(self, epochs_done: int) -> bool:
        """``should_stop`` is honoured once ``min_epochs`` and ``min_steps`` are met (Lightning's rule)."""
        cfg = self.cfg
        return (not cfg.min_epochs or epochs_done >= cfg.min_epochs) and \
            (not cfg.min_steps or self.trainer.global_step >= cfg.min_steps)

    def _fit_done(self) -> bool:
        t, cfg = self.trainer, self.cfg
        if self.num_train_batches == 0:  # limit_train_batches=0 or an empty loader: no epoch runs (Lightning)
            return True
        if cfg.max_steps != -1 and t.global_step >= cfg.max_steps:
            return True
        if cfg.max_epochs != -1 and t.current_epoch >= cfg.max_epochs:
            return True
        # set before any epoch (a Timer at fit start, a callback's on_train_start): Lightning's fit loop is done
        return t.should_stop and self._can_stop_early(t.current_epoch)

    # -- one epoch ----------------------------------------------------------------------------
    def _batches(self) -> Any:
        """This epoch's batch iterator, fast-forwarded when resuming mid-epoch.

        Loaders due for ``reload_dataloaders_every_n_epochs`` are requested again first (train, then
        val), before ``on_train_epoch_start``, as Lightning does.
        """
        t = self.trainer
        self._batches_before += self.batches_done  # the previous epoch's, for check_val_every_n_epoch=None
        fit_data = t._fit_data
        if fit_data is not None and fit_data.train_reload_due():
            self.train_loader = fit_data.load_train()
            self.num_train_batches = t.num_training_batches
        if fit_data is not None and self._val_epoch() and (not fit_data.val_loaded or fit_data.val_reload_due()):
            self.val_loaders = fit_data.reload_val()
        self.hooks.call("on_train_epoch_start")
        data.set_epoch(self.train_loader, t.current_epoch)
        skip, resume, self.resume = 0, self.resume, None
        if resume is not None and resume["epoch_rng"] is not None:
            restore_rng(resume["epoch_rng"])  # the shuffle of this epoch draws from these states
        self.epoch_start_rng = capture_rng()
        loader = self.train_loader
        it = loader._batches() if isinstance(loader, data.CombinedLoader) else iter(loader)
        if resume is not None:
            skip = resume["batches_done"]
            for _ in range(skip):  # replay the sampler; these batches were trained on before the save
                next(it)
            if resume["rng"] is not None:
                restore_rng(resume["rng"])
        if self.hooks.transfer:  # the batch-transfer hooks move each batch (run_epoch)
            return it, skip
        return device_batches(it, self.strategy.root_device, self.cfg.prefetch), skip

    def run_epoch(self) -> None:
        t, cfg, hooks, store, prec = self.trainer, self.cfg, self.hooks, self.store, self.precision
        step_fn, opt, params = self.step_fn, self.optimizer, self.params
        clip, log_every, max_steps = cfg.gradient_clip_val, cfg.log_every_n_steps, cfg.max_steps
        manual = not self.module.automatic_optimization
        general, transfer, device = self.general, hooks.transfer, self.strategy.root_device
        step_scheds, epoch_scheds = bool(self.step_schedulers), bool(self.epoch_schedulers)
        batches, skip = self._batches()  # may reload the loaders: read the counts after it
        accum, total = cfg.accumulate_grad_batches, self.num_train_batches
        val_every, val_offset = self._val_interval(), self._val_offset()
        self.epoch_done, self.batches_done, self.epoch_scheds_stepped = False, skip, False
        if self.bar is not None:
            self.bar.start_epoch(t.current_epoch, cfg.max_epochs, None if total == math.inf else int(total))
        store.context = store.TRAIN_STEP
        stopped_early = False
        batch_idx = skip - 1
        for batch in batches:
            batch_idx += 1
            if batch_idx >= total:
                break
            self.batch_idx = batch_idx
            if transfer:
                batch = transfer_batch(hooks, batch, device, 0)
            store.batch = batch
            skip_rest = False
            for f in hooks.on_train_batch_start:
                response = f(batch, batch_idx)
                skip_rest = skip_rest or (type(response) is int and response == -1)
            stepping = manual or (batch_idx + 1) % accum == 0 or batch_idx + 1 == total
            if skip_rest:  # Lightning: on_train_batch_start returned -1, the rest of the epoch is skipped
                self.batches_done = batch_idx + 1
                self._step_schedulers(last=True)
                break
            if manual:
                with prec.forward_context():
                    out = step_fn(batch, batch_idx)
            elif general:
                out = self.general_step.run(batch, batch_idx, stepping)
            elif stepping or t.world_size == 1:
                out = self._forward_backward(step_fn, batch, batch_idx, accum)
            else:
                with self.strategy.no_sync():  # accumulate locally; DDP syncs on the stepping micro-batch
                    out = self._forward_backward(step_fn, batch, batch_idx, accum)
            if stepping:
                if not manual and not general and out is not None:
                    for f in hooks.on_before_optimizer_step:
                        f(opt)
                    if clip:
                        prec.clip(opt, params, clip, cfg.gradient_clip_algorithm)
                    prec.step(opt)
                    for f in hooks.on_before_zero_grad:
                        f(opt)
                    opt.zero_grad(set_to_none=True)
                if not manual:
                    t.global_step += 1  # manual optimization: each optimizer.step() counts (LightningOptimizer)
                t._batches_stepped += 1
            if stepping and step_scheds or epoch_scheds and batch_idx + 1 == total:
                self._step_schedulers(last=batch_idx + 1 == total, stepped=stepping)
            if stepping and self.log_needed and t._batches_stepped % log_every == 0:
                t._log_step_metrics()
            self.batches_done = batch_idx + 1
            if hooks.on_train_batch_end:
                if manual or not general:
                    out = batch_output(out, accum, manual)
                for f in hooks.on_train_batch_end:
                    f(out, batch, batch_idx)
            if self.bar is not None:
                self.bar.update(batch_idx + 1, store.progress)
            if val_every and (val_offset + batch_idx + 1) % val_every == 0 and batch_idx + 1 != total:
                self.run_validation()
                store.context = store.TRAIN_STEP
            if stepping and (max_steps != -1 and t.global_step >= max_steps
                             or t.should_stop and self._can_stop_early(t.current_epoch)):
                stopped_early = self.batches_done < total
                break
        self.epoch_done = not stopped_early
        self._end_epoch()

    def _step_schedulers(self, last: bool, stepped: bool = False) -> None:
        """Lightning's order: step-interval schedulers after a step; epoch-interval ones on the epoch's last batch."""
        t = self.trainer
        if stepped:
            for s in self.step_schedulers:
                if t.global_step % s.frequency == 0:
                    t._step_scheduler(s)
        if last and not self.epoch_scheds_stepped:
            self.epoch_scheds_stepped = True
            for s in self.epoch_schedulers:
                if not s.reduce_on_plateau and (t.current_epoch + 1) % s.frequency == 0:
                    t._step_scheduler(s)

    def _forward_backward(self, step_fn, batch: Any, batch_idx: int, accum: int) -> Any:
        with self.precision.forward_context():
            out = step_fn(batch, batch_idx)
        loss = _loss_of(out)
        if loss is None:
            return None
        if accum > 1:
            loss = loss / accum
        if self.hooks.on_before_backward:
            loss = self.precision.scale_loss(loss)  # the hooks see what backward runs on, as in Lightning
            for f in self.hooks.on_before_backward:
                f(loss)
            loss.backward()
        else:
            self.precision.backward(loss)
        for f in self.hooks.on_after_backward:
            f()
        return out

    def _val_interval(self) -> int:
        """Validate inside this epoch every this many batches (0: none before its last batch).

        Lightning validates after batch ``i`` when ``(i + 1) % val_check_batch == 0``, counting batches
        across epochs when ``check_val_every_n_epoch=None``; so ``val_check_interval=1/3`` of 10
        batches validates after batches 3, 6 and 9, and not again at the epoch's end.
        """
        vcb = self.trainer.val_check_batch
        if not self._val_epoch() or vcb == math.inf:
            return 0
        return int(vcb)

    def _val_offset(self) -> int:
        """Batches of earlier epochs that count towards the interval (all of them when check_val_every_n_epoch=None)."""
        return self._batches_before if self.cfg.check_val_every_n_epoch is None else 0

    def _val_epoch(self) -> bool:
        """Validation can run in this epoch: loaders, validation_step, check_val_every_n_epoch."""
        n = self.cfg.check_val_every_n_epoch
        due = n is None or (self.trainer.current_epoch + 1) % n == 0
        fit_data = self.trainer._fit_data
        if fit_data is None:
            return due and bool(self.val_loaders)
        # not requested yet (no sanity check, no validation in the first epochs): requested when first due
        return due and fit_data.validation_possible() and (bool(self.val_loaders) or not fit_data.val_loaded)

    def _val_due(self) -> bool:
        """Validation runs after the epoch's last batch: the interval falls on it, or the epoch is unsized."""
        if not self._val_epoch():
            return False
        vcb = self.trainer.val_check_batch
        if vcb == math.inf:
            return True
        return (self._val_offset() + self.batches_done) % int(vcb) == 0

    def _end_epoch(self) -> None:
        t, store = self.trainer, self.store
        if self.epoch_done and self._val_due() and data.num_batches(self.val_loaders[0], self.cfg.limit_val_batches):
            self.run_validation()
        store.context = store.TRAIN_EPOCH
        if self.epoch_done:  # a loader without a length: its last batch was known only now
            self._step_schedulers(last=True)
        metrics = store.reduce_epoch("train")  # callbacks read epoch means in on_train_epoch_end, as in Lightning
        self.hooks.call("on_train_epoch_end")
        metrics.update(store.reduce_epoch("train"))  # what the hooks themselves logged
        if self.bar is not None:
            t._log_step_metrics(to_logger=False)  # fresh numbers for the bar's last line of the epoch
        t._log_epoch_metrics(metrics)
        self.hooks.call("on_train_epoch_end_monitors")
        if self.epoch_done:
            for s in self.epoch_schedulers:
                if s.reduce_on_plateau and (t.current_epoch + 1) % s.frequency == 0:
                    t._step_scheduler(s)
        t.should_stop = self.strategy.any(t.should_stop) if t.world_size > 1 else t.should_stop
        if self.bar is not None:
            self.bar.end_epoch(self.batches_done, store.progress)
        if t.logger is not None and t.is_global_zero:
            t.logger.save()
        store.context = store.TRAIN_STEP

    # -- validation ---------------------------------------------------------------------------
    def is_last_batch(self, batch_idx: int) -> bool:
        return batch_idx + 1 >= self.num_train_batches

    def run_validation(self, sanity: bool = False) -> None:
        if not sanity:
            self.trainer._val_has_run = True
            if self.batches_done % self.cfg.accumulate_grad_batches == 0 or self.batches_done >= self.num_train_batches:
                self.module.on_validation_model_zero_grad()  # no gradients held through validation (Lightning's)
            EvalLoop(self.trainer, self.module, "validate", self.val_loaders).run()
        else:  # as Lightning: the sanity check leaves the random state as it found it (same shuffles, same dropout)
            rng = capture_rng()
            EvalLoop(self.trainer, self.module, "validate", self.val_loaders, sanity=True).run()
            restore_rng(rng)
        self.store.context = self.store.TRAIN_STEP
