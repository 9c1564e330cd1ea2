"""The fit loop. The per-step code is meant to read like nanoGPT's training loop.

Per step: forward under the precision context, backward, (clip), step, zero
grads, count. Nothing syncs with the device per step: logged values stay
tensors until ``log_every_n_steps``; hooks nobody overrides are empty lists.

That inline step is the fast path. A module that overrides a hook with a default
behaviour (``optimizer_step``, ``backward``, the batch transfer...) runs each batch
through ``stepping.GeneralStep`` instead, which calls every hook in Lightning's
order; the choice is made once per fit (``Hooks.general``). How ``training_step`` is called
(``(batch, batch_idx)``, ``(batch)``, or ``(dataloader_iter)``, see ``dataloader_iter.py``) is
decided once per fit too.
"""

from __future__ import annotations

import inspect
import itertools
import math
import warnings
from typing import Any, Mapping

import torch

from gpulayer.trainer import data, dataloader_iter, fit_checks, loader_state, profilers, trainer_logging
from gpulayer.trainer.optimizers import step_scheduler
from gpulayer.trainer.evaluate import EvalLoop
from gpulayer.trainer.loops.closure import NONE_RETURNED, Closure
from gpulayer.trainer.loops.optimization.manual import ManualResult
from gpulayer.trainer.prefetch import device_batches
from gpulayer.trainer.stepping import GeneralStep, _loss_of, transfer_batch
from gpulayer.trainer.plugins.precision.precision import converts_input, customizes_step
from gpulayer.trainer.seed import capture_rng, restore_rng
from gpulayer.trainer.utilities.rank_zero import WarningCache


def batch_output(out: Any, accum: int, manual: bool) -> dict:
    """What ``on_train_batch_end`` receives, as in Lightning: ``{"loss": detached loss, **other keys}`` (``{}``: skipped)."""
    if manual:
        return ManualResult.from_training_step_output(out).asdict()
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
    """One fit's loop; it owns the fit's position (``epoch``, ``batch_idx``, ``batches_done``, ``epoch_done``),
    its loaders (``train_loader``, ``val_loaders``, requested through ``fit_data``) and its schedule of validation
    (``val_epoch``, ``validates_at_epoch_end``). ``trainer.loop`` is the running (or last) fit's."""

    def __init__(self, trainer, module, step_fn, resume: dict | None, sanity_check: bool = False,
                 fit_data: Any = None):
        cfg = trainer.config
        self.trainer, self.module, self.cfg = trainer, module, cfg
        # how training_step is called (with batch_idx, without, or with `dataloader_iter`), decided once per fit
        flavour = dataloader_iter.training_flavour(module)
        self.dl_iter = flavour == "iterator"
        self.step_fn = dataloader_iter.training_step_fn(step_fn, flavour)
        self.strategy, self.precision, self.hooks, self.store = trainer.strategy, trainer.precision_plugin, trainer.hooks, trainer.metric_store
        # the loaders come from fit_data (fit_data.FitData) in run(), requested in Lightning's order (around the
        # sanity check); None: the loaders are given (val_loaders) and never reloaded
        self.fit_data = fit_data
        self.train_loader: Any = None
        self.val_loaders: list = []
        self.resume = resume
        self.num_train_batches: float = 0
        self.sanity_check = sanity_check
        self.batches_done = 0
        self.batch_idx = -1  # the batch being trained on (``trainer.is_last_batch``); kept after the epoch ends
        self._batches_before = 0  # train batches of the epochs before this one
        self.epoch_done = False
        self.epoch_start_rng: dict | None = None
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self._split_schedulers()
        # step values are made numbers at log intervals for the logger (log_every_n_steps=0: never); the
        # progress bar reads them itself, only for a line it draws
        self.log_needed = trainer.logger is not None and cfg.log_every_n_steps > 0
        # decided once per fit: the general path calls every step hook in Lightning's order (stepping.py)
        # (and for an optimizer that must call the closure itself, like LBFGS)
        self.general = self.hooks.general or (module.automatic_optimization and _needs_closure(self.optimizer)) \
            or customizes_step(self.precision)  # a user's precision plugin: every one of its methods is called
        self.convert = self.precision.convert_input if converts_input(self.precision) else None
        self.general_step = GeneralStep(self)
        self.profiler = trainer.profiler
        if profilers.active(self.profiler):  # decided once: without a profiler nothing is wrapped
            self.step_fn = profilers.wrapper(self.profiler)(
                self.step_fn, f"[Strategy]{type(trainer.strategy).__name__}.training_step")
        self.epoch, self.validated_at = trainer.current_epoch, -1  # the epoch running (or last run); its last validation
        self.warned_none_batch = False
        self.loader_restored = False  # a resume gave stateful loaders their position: no replay
        self.batch_idx = -1  # the batch running (or last run) in this epoch
        self.info_once = WarningCache()

    def _split_schedulers(self) -> None:
        """The schedulers by when they step; read again each epoch, after ``on_train_epoch_start``, where a
        callback may replace them (``StochasticWeightAveraging`` swaps in its ``SWALR``)."""
        # under manual optimization the user steps the schedulers (Lightning never does)
        scheds = self.trainer.lr_scheduler_configs if self.module.automatic_optimization else []
        self._scheds_seen = list(scheds)
        self.step_schedulers = [c for c in scheds if c.interval == "step" and not c.reduce_on_plateau]
        # a plateau scheduler reads a metric validation may log: stepped after the batch's validation (Lightning)
        self.step_plateaus = [c for c in scheds if c.interval == "step" and c.reduce_on_plateau]
        self.epoch_schedulers = [c for c in scheds if c.interval == "epoch"]

    # -- fit --------------------------------------------------------------------------------
    def run(self) -> None:
        t = self.trainer
        fit_data = self.fit_data  # the fit's first loaders, in Lightning's order: sanity check (val), train, val
        if self.sanity_check and fit_data.validation_possible():
            self.run_validation(sanity=True, loaders=fit_data.load_sanity_val)
        self.train_loader = fit_data.load_train()
        self.num_train_batches = t.num_training_batches
        if fit_data.first_val_due():
            self.val_loaders = fit_data.reload_val()
        fit_checks.warn_eval_modules(self.module)
        if self.resume is not None:  # loaders that keep their position get it back (Lightning's stateful loaders)
            self.loader_restored = loader_state.load_state_dicts(self.train_loader, self.resume.get("loader_states"))
            fit_checks.warn_resume_mid_epoch(t, self.train_loader, self.num_train_batches,
                                              replayed_exactly=self.resume["epoch_rng"] is not None)
        self.hooks.call("on_train_start")
        if self.resume is not None and self.resume["epoch_done"]:
            t.current_epoch = self.resume["epoch"] + 1
            if self.resume["rng"] is not None:
                restore_rng(self.resume["rng"])
            self.resume = None
        elif self.resume is not None:
            t.current_epoch = self.resume["epoch"]
        try:
            while not self._fit_done():
                with self.profiler.profile("run_training_epoch"):
                    self.run_epoch()
                t.current_epoch += 1  # an epoch cut short (max_steps, max_time, should_stop) counts, as in Lightning
                if not self.epoch_done or t.should_stop and self._can_stop_early(t.current_epoch):
                    break
            self.hooks.call("on_train_end")
        finally:  # persistent DataLoader workers stop with the fit, also a failed one (Lightning's teardown)
            for loader in [self.train_loader, *self.val_loaders]:
                data.shut_down_workers(loader)

    def _can_stop_early(self, epochs_done: int) -> bool:
        """``should_stop`` is honoured once ``min_epochs`` and ``min_steps`` are met (Lightning's rule)."""
        cfg = self.cfg
        can = (not cfg.min_epochs or epochs_done >= cfg.min_epochs) and \
            (not cfg.min_steps or self.trainer.global_step >= cfg.min_steps)
        if not can:  # asked only while should_stop is set
            self.info_once.info(f"Trainer was signaled to stop but the required `min_epochs={cfg.min_epochs!r}` or "
                                f"`min_steps={cfg.min_steps!r}` has not been met. Training will continue...")
        return can

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
        fit_data = self.fit_data
        if fit_data is not None and fit_data.train_reload_due():
            self.train_loader = fit_data.load_train()
            self.num_train_batches = t.num_training_batches
        if fit_data is not None and self.val_epoch() and (not fit_data.val_loaded or fit_data.val_reload_due()):
            self.val_loaders = fit_data.reload_val()
        if self.resume is None or not self.resume["batches_done"]:  # resumed mid-epoch: it had started (Lightning)
            self.hooks.call("on_train_epoch_start")
        data.set_epoch(self.train_loader, t.current_epoch)
        skip, resume, self.resume = 0, self.resume, None
        if resume is not None and resume["epoch_rng"] is not None:
            restore_rng(resume["epoch_rng"])  # the shuffle of this epoch draws from these states
        self.epoch_start_rng = capture_rng()
        loader = self.train_loader
        it = data.batches_of(loader)
        it = profilers.timed(it, self.profiler, "[_TrainingEpochLoop].train_dataloader_next")
        if self.num_train_batches != math.inf:  # no batch past the limit is fetched (nor timed)
            it = itertools.islice(it, int(self.num_train_batches))
        if resume is not None:
            skip = resume["batches_done"]
            for _ in range(0 if self.loader_restored else skip):  # replay the sampler: trained on before the save
                next(it)
            if resume["rng"] is not None:
                restore_rng(resume["rng"])
        if self.dl_iter:  # the step pulls (and moves) its batches itself
            return dataloader_iter.steps(dataloader_iter.train_iterator(it, self.num_train_batches, skip)), skip
        if self.hooks.transfer:  # the batch-transfer hooks move each batch (run_epoch)
            return it, skip
        return device_batches(it, self.strategy.root_device, self.cfg.prefetch), skip

    def run_epoch(self) -> None:
        t, cfg, hooks, store, prec = self.trainer, self.cfg, self.hooks, self.store, self.precision
        step_fn, opt, params = self.step_fn, self.optimizer, self.params
        clip, log_every, max_steps = cfg.gradient_clip_val, cfg.log_every_n_steps, cfg.max_steps
        manual = not self.module.automatic_optimization
        general, device, dl_iter, convert = self.general, self.strategy.root_device, self.dl_iter, self.convert
        transfer = hooks.transfer and not dl_iter
        step_scheds, epoch_scheds = bool(self.step_schedulers), bool(self.epoch_schedulers)
        step_plateaus = bool(self.step_plateaus)
        batches, skip = self._batches()  # may reload the loaders: read the counts after it
        if self.module.automatic_optimization and self._scheds_seen != t.lr_scheduler_configs:
            self._split_schedulers()
            step_scheds, epoch_scheds = bool(self.step_schedulers), bool(self.epoch_schedulers)
            step_plateaus = bool(self.step_plateaus)
        accum, total = cfg.accumulate_grad_batches, self.num_train_batches
        val_every, val_offset = self._val_interval(), self._val_offset()
        self.epoch_done, self.batches_done, self.epoch_scheds_stepped = False, skip, False
        self.epoch, self.validated_at = t.current_epoch, -1
        if skip and val_every and (val_offset + skip) % val_every == 0:
            # resumed right after a batch that validated in the fit that saved: not run again, but counted (Lightning)
            t.val_has_run, self.validated_at = True, skip
        store.context = store.TRAIN_STEP
        stopped_early = False
        batch_idx = self.batch_idx = skip - 1
        for batch in batches:
            batch_idx += 1
            if batch_idx >= total:
                break
            self.batch_idx = batch_idx  # trainer.is_last_batch reads it, inside the step already
            if transfer:
                batch = transfer_batch(hooks, batch, device, 0)
            if convert is not None and not dl_iter:  # e.g. 64-true: float batches in float64
                batch = convert(batch)
            # the hooks see the batch; with `dataloader_iter`, the last one the step took (Lightning's)
            seen, seen_idx = (batch.batch, batch.batch_idx) if dl_iter else (batch, batch_idx)
            store.batch = seen
            if seen is None and not dl_iter:
                self._none_batch(batch_idx, total, val_every, val_offset)
                continue
            skip_rest = False
            for f in hooks.on_train_batch_start:
                response = f(seen, seen_idx)
                skip_rest = skip_rest or (type(response) is int and response == -1)
            stepping = manual or (batch_idx + 1) % accum == 0 or batch_idx + 1 == total
            if skip_rest:  # Lightning: on_train_batch_start returned -1, the rest of the epoch is skipped
                self.batches_done = batch_idx + 1
                self._step_schedulers(batch_idx, last=True)
                break
            if manual:
                with prec.train_step_context():
                    out = step_fn(batch, batch_idx)
                if not (out is None or isinstance(out, (torch.Tensor, Mapping))):
                    ManualResult.from_training_step_output(out)  # raises Lightning's error, listened to or not
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
                t.batches_stepped += 1
            if stepping and step_scheds or epoch_scheds and batch_idx + 1 == total:
                self._step_schedulers(batch_idx, last=batch_idx + 1 == total, stepped=stepping)
            if stepping and self.log_needed and t.batches_stepped % log_every == 0:
                trainer_logging.log_step_metrics(t)
            self.batches_done = batch_idx + 1
            if hooks.on_train_batch_end:
                if hooks.train_batch_end_outputs and (manual or not general):
                    out = batch_output(out, accum, manual)
                if dl_iter:
                    seen, seen_idx = batch.batch, batch.batch_idx
                for f in hooks.on_train_batch_end:
                    f(out, seen, seen_idx)
            if val_every and (val_offset + batch_idx + 1) % val_every == 0 and batch_idx + 1 != total:
                self.run_validation()
                store.context = store.TRAIN_STEP
            if stepping and step_plateaus and batch_idx + 1 != total:  # the last batch's: after its validation
                self._step_schedulers(batch_idx, last=False, stepped=True, plateau=True)
            if t._received_sigterm and stepping and batch_idx + 1 != total:  # a preemption (cluster fits only)
                t._on_sigterm()
            if stepping and (max_steps != -1 and t.global_step >= max_steps
                             or t.should_stop and self._can_stop_early(t.current_epoch)):
                stopped_early = self.batches_done < total
                break
        self.epoch_done = not stopped_early
        self._end_epoch()

    def _none_batch(self, batch_idx: int, total: float, val_every: int, val_offset: int) -> None:
        """The loader gave ``None``: no step, as in Lightning (a warning; ``on_train_batch_end`` gets ``None``)."""
        t = self.trainer
        if not self.warned_none_batch:
            self.warned_none_batch = True
            warnings.warn("train_dataloader yielded None. If this was on purpose, ignore this warning...",
                          UserWarning, stacklevel=3)
        last = batch_idx + 1 == total
        if (batch_idx + 1) % self.cfg.accumulate_grad_batches == 0 or last:
            t.batches_stepped += 1
        if last:
            self._step_schedulers(batch_idx, last=True)
        self.batches_done = batch_idx + 1
        for f in self.hooks.on_train_batch_end:
            f(None, None, batch_idx)
        if val_every and (val_offset + batch_idx + 1) % val_every == 0 and not last:
            self.run_validation()
            self.store.context = self.store.TRAIN_STEP

    def _step_schedulers(self, batch_idx: int, last: bool, stepped: bool = False, plateau: bool = False) -> None:
        """Lightning's order: step-interval schedulers after a step; epoch-interval ones on the epoch's last batch.

        A step-interval scheduler's ``frequency`` counts the epoch's batches, as in Lightning: it steps after
        batch ``i`` when ``(i + 1) % frequency == 0``. ``plateau``: the step-interval ReduceLROnPlateau ones.
        """
        t = self.trainer
        if stepped:
            for s in self.step_plateaus if plateau else self.step_schedulers:
                if (batch_idx + 1) % s.frequency == 0:
                    step_scheduler(t, s)
        if plateau:
            return
        if last and not self.epoch_scheds_stepped:
            self.epoch_scheds_stepped = True
            for s in self.epoch_schedulers:
                if not s.reduce_on_plateau and (t.current_epoch + 1) % s.frequency == 0:
                    step_scheduler(t, s)

    def _forward_backward(self, step_fn, batch: Any, batch_idx: int, accum: int) -> Any:
        with self.precision.train_step_context():
            out = step_fn(batch, batch_idx)
        loss = _loss_of(out)
        if loss is None:
            Closure.warning_cache.warn(NONE_RETURNED)
            return None
        if accum > 1:
            loss = loss / accum
        if self.hooks.on_before_backward:
            loss = self.precision.scale_loss(loss)  # the hooks see what backward runs on, as in Lightning
            for f in self.hooks.on_before_backward:
                f(loss)
            loss.backward()
        else:
            self.precision.scale_loss(loss).backward()
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
        if not self.val_epoch() or vcb == math.inf:
            return 0
        return int(vcb)

    def _val_offset(self) -> int:
        """Batches of earlier epochs that count towards the interval (all of them when check_val_every_n_epoch=None)."""
        return self._batches_before if self.cfg.check_val_every_n_epoch is None else 0

    def val_epoch(self) -> bool:
        """Validation can run in this epoch: loaders, validation_step, check_val_every_n_epoch."""
        n = self.cfg.check_val_every_n_epoch
        due = n is None or (self.trainer.current_epoch + 1) % n == 0
        fit_data = self.fit_data
        if fit_data is None:
            return due and bool(self.val_loaders)
        # not requested yet (no sanity check, no validation in the first epochs): requested when first due
        return due and fit_data.validation_possible() and (bool(self.val_loaders) or not fit_data.val_loaded)

    def _val_due(self) -> bool:
        """Validation runs after the epoch's last batch: the interval falls on it, or the epoch is unsized
        (or its steps took their batches themselves through ``dataloader_iter``)."""
        if not self.val_epoch():
            return False
        vcb = self.trainer.val_check_batch
        if vcb == math.inf or self.dl_iter:
            return True
        return (self._val_offset() + self.batches_done) % int(vcb) == 0

    def _stop_validation(self) -> bool:
        """``should_stop`` (also set by ``max_time``'s Timer) ended training: Lightning validates once more after that batch."""
        t = self.trainer
        stopping = t.should_stop and self._can_stop_early(t.current_epoch)  # a Timer's max_time sets should_stop
        return stopping and self.validated_at != self.batches_done and self.val_epoch()

    def _end_epoch(self) -> None:
        t, store = self.trainer, self.store
        if (self.epoch_done and self._val_due() or self._stop_validation()) and self.val_loaders and \
                data.num_batches(self.val_loaders[0], self.cfg.limit_val_batches):
            self.run_validation()
        store.context = store.TRAIN_EPOCH
        if self.epoch_done:  # a loader without a length: its last batch was known only now
            self._step_schedulers(self.batches_done - 1, last=True)
        if self.epoch_done and self.step_plateaus and self.batches_done == self.num_train_batches:
            self._step_schedulers(self.batches_done - 1, last=False, stepped=True, plateau=True)
        metrics = store.reduce_epoch("train")  # callbacks read epoch means in on_train_epoch_end, as in Lightning
        self.hooks.call("on_train_epoch_end")
        metrics.update(store.reduce_epoch("train"))  # what the hooks themselves logged
        trainer_logging.log_epoch_metrics(t, metrics)
        self.hooks.call("on_train_epoch_end_monitors")
        if self.epoch_done:
            for s in self.epoch_schedulers:
                if s.reduce_on_plateau and (t.current_epoch + 1) % s.frequency == 0:
                    step_scheduler(t, s)
        t.should_stop = self.strategy.any(t.should_stop) if t.world_size > 1 else t.should_stop
        if t.is_global_zero:
            for logger in t.loggers:
                logger.save()
        store.context = store.TRAIN_STEP

    # -- validation ---------------------------------------------------------------------------
    def is_last_batch(self, batch_idx: int) -> bool:
        return batch_idx + 1 >= self.num_train_batches

    def validates_at_epoch_end(self) -> bool:
        """Validation will run after this epoch's last batch (and has batches to run)."""
        return self._val_due() and sum(self.trainer.num_val_batches) > 0

    def run_validation(self, sanity: bool = False, loaders: Any = None) -> None:
        """``loaders``: for the sanity check, the function that requests the val loaders inside it."""
        if not sanity:
            self.trainer.val_has_run = True
            self.validated_at = self.batches_done
            if self.batches_done % self.cfg.accumulate_grad_batches == 0 or self.batches_done >= self.num_train_batches:
                self.module.on_validation_model_zero_grad()  # no gradients held through validation (Lightning's)
            EvalLoop(self.trainer, self.module, "validate", self.val_loaders).run()
        else:  # as Lightning: the sanity check leaves the random state as it found it (same shuffles, same dropout)
            rng = capture_rng()
            loop = EvalLoop(self.trainer, self.module, "validate", loaders or self.val_loaders, sanity=True)
            loop.run()
            self.val_loaders = loop.loaders
            restore_rng(rng)
        self.store.context = self.store.TRAIN_STEP
