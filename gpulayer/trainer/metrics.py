"""What ``self.log`` records, kept on the device until someone needs a number.

Each loop (training, validation, test) has its own ``Results``: one ``Entry`` per
(hook, name, loader) logged, as Lightning keys them, so a value logged in
``validation_step`` never shows up in a training log line and a name logged
from two hooks is two results. Per step an entry keeps the latest detached
value (no ``.item()``: no host sync); epoch values are reduced with one stack per
entry, and turned into floats only for the logger and the progress bar.

The trainer-wide dicts (``callback_metrics``, ``logged_metrics``,
``progress_bar_metrics``) hold what earlier steps and epochs produced; reading
them merges in the live values of the running loop, as Lightning's do.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

import torch

from gpulayer.trainer.errors import MisconfigurationException

DATALOADER_SUFFIX = "/dataloader_idx_{}"

# Where self.log may be called, per hook: (default on_step, default on_epoch, on_step allowed, on_epoch allowed).
# None: logging is refused in that hook. These are Lightning's documented levels ("Logging" page, hook table).
_ANY = (False, True)
_STEP = (True, False, _ANY, _ANY)        # per optimizer step: training_step and the hooks around it
_EVAL = (False, True, _ANY, _ANY)        # per eval batch, reduced over the epoch by default
_EPOCH = (False, True, (False,), (True,))  # hooks that run once: only epoch-level values make sense
FX_RULES: dict[str, tuple | None] = {
    **dict.fromkeys(("training_step", "on_train_batch_start", "on_train_batch_end", "on_before_backward", "backward",
                     "on_after_backward", "on_before_optimizer_step", "optimizer_step", "configure_gradient_clipping",
                     "clip_gradients", "on_before_zero_grad", "optimizer_zero_grad"), _STEP),
    **dict.fromkeys(("validation_step", "test_step", "on_validation_batch_start", "on_validation_batch_end",
                     "on_test_batch_start", "on_test_batch_end"), _EVAL),
    **dict.fromkeys(("on_train_start", "on_validation_start", "on_test_start", "on_train_epoch_start",
                     "on_train_epoch_end", "on_validation_epoch_start", "on_validation_epoch_end",
                     "on_test_epoch_start", "on_test_epoch_end"), _EPOCH),
    **dict.fromkeys(("lr_scheduler_step", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
                     "on_train_end", "on_validation_end", "on_test_end", "on_predict_start", "on_predict_end",
                     "on_predict_epoch_start", "on_predict_epoch_end", "on_before_batch_transfer",
                     "transfer_batch_to_device", "on_after_batch_transfer", "on_predict_batch_start",
                     "on_predict_batch_end", "on_exception", "state_dict", "on_save_checkpoint", "on_load_checkpoint",
                     "load_state_dict", "setup", "teardown", "configure_sharded_model", "configure_model",
                     "predict_step", "configure_optimizers", "train_dataloader", "val_dataloader", "test_dataloader",
                     "prepare_data", "configure_callbacks", "on_validation_model_zero_grad", "on_validation_model_eval",
                     "on_test_model_eval", "on_validation_model_train", "on_test_model_train"), None),
}

_REDUCE_NAMES = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}
_REDUCE_FNS = {torch.mean: "mean", torch.sum: "sum", sum: "sum", torch.max: "max", max: "max", torch.min: "min",
               min: "min"}


def reduce_name(reduce_fx: Any) -> str:
    """``"mean"`` / ``"sum"`` / ``"max"`` / ``"min"`` for what Lightning accepts (strings any case, ``"avg"``,
    ``torch.mean``..., builtin ``sum``/``max``/``min``); anything else is refused with Lightning's message."""
    found = _REDUCE_NAMES.get(reduce_fx.lower()) if isinstance(reduce_fx, str) else _REDUCE_FNS.get(reduce_fx)
    if found is None:
        raise MisconfigurationException(
            "Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported. If you need a custom reduction, please "
            f"log a `torchmetrics.Metric` instance instead. Found: {reduce_fx}")
    return found


def current_hook(frame: Any) -> str | None:
    """The Lightning hook this ``self.log`` runs under: the nearest caller whose name is a hook.

    The fit loop does not announce each hook (that would cost on every step for
    modules that never log); the call stack already says which hook is running.
    """
    depth = 0
    while frame is not None and depth < 64:
        name = frame.f_code.co_name
        if name in FX_RULES:
            return name
        frame, depth = frame.f_back, depth + 1
    return None


def is_torchmetric(value: Any) -> bool:
    mod = sys.modules.get("torchmetrics")
    return mod is not None and isinstance(value, mod.Metric)


def batch_size_of(batch: Any) -> int:
    """Lightning's inference: the length of the first tensor found in the batch."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.ndim else 1
    if isinstance(batch, (list, tuple)):
        for b in batch:
            n = batch_size_of(b)
            if n:
                return n
    if isinstance(batch, dict):
        for b in batch.values():
            n = batch_size_of(b)
            if n:
                return n
    return 1


def float_dtype() -> torch.dtype:
    """Logged values are reduced in the default float dtype, never below float32 (Lightning's rule)."""
    dtype = torch.get_default_dtype()
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=4)


def is_metric_collection(value: Any) -> bool:
    mod = sys.modules.get("torchmetrics")
    return mod is not None and isinstance(value, mod.MetricCollection)


class Entry:
    """One ``self.log`` result: its options, the latest step value and the epoch's values so far."""

    __slots__ = ("fx", "name", "options", "raw", "prog_bar", "logger", "on_step", "on_epoch", "reduce", "enable_graph",
                 "add_dl", "dl_idx", "sync", "group", "metric", "step_value", "values", "sizes", "computed",
                 "has_reset")

    def __init__(self, fx, name, options, prog_bar, logger, on_step, on_epoch, reduce, enable_graph, add_dl, dl_idx,
                 sync, group, metric):
        self.fx, self.name, self.options = fx, name, options
        self.raw: tuple = ()  # the last call's arguments as given, to skip the checks when they repeat
        self.prog_bar, self.logger, self.on_step, self.on_epoch = prog_bar, logger, on_step, on_epoch
        self.reduce, self.enable_graph, self.add_dl, self.dl_idx = reduce, enable_graph, add_dl, dl_idx
        self.sync, self.group, self.metric = sync, group, metric
        self.step_value: Any = None
        self.values: list = []
        self.sizes: list = []
        self.computed: torch.Tensor | None = None
        self.has_reset = False

    def names(self, on_step: bool) -> tuple[str, str]:
        """(plain name, ``_step``/``_epoch`` name when logged at both levels), with the loader suffix after both."""
        forked = f"{self.name}_{'step' if on_step else 'epoch'}" if self.on_step and self.on_epoch else self.name
        if self.add_dl and self.dl_idx is not None:
            suffix = DATALOADER_SUFFIX.format(self.dl_idx)
            return self.name + suffix, forked + suffix
        return self.name, forked

    def reset(self) -> None:
        self.step_value, self.values, self.sizes, self.computed, self.has_reset = None, [], [], None, True
        if self.metric is not None:
            self.metric.reset()


class Results:
    """One loop's results (Lightning's ``_ResultCollection``): entries by (hook, name, loader)."""

    def __init__(self, training: bool):
        self.training = training
        self.entries: dict[tuple, Entry] = {}
        self.in_batch = False  # between a batch's start and the epoch end: step values are the live ones

    def reset(self) -> None:
        for e in self.entries.values():
            e.reset()
        self.in_batch = False


class MetricStore:
    """One Trainer's logged values: per-loop results and the trainer-wide metric dicts."""

    # (default on_step, default on_epoch, which results) per loop context; the running hook refines the defaults
    TRAIN_STEP, TRAIN_EPOCH, VAL = (True, False, "train"), (False, True, "train"), (False, True, "val")
    TEST, PREDICT = (False, True, "test"), (False, True, "predict")

    def __init__(self, reduce_fn: Callable[[torch.Tensor, str], torch.Tensor] | None = None):
        self.results = {"train": Results(True), "val": Results(False), "test": Results(False),
                        "predict": Results(False)}
        self.callback: dict[str, torch.Tensor] = {}   # trainer.callback_metrics
        self.logged: dict[str, torch.Tensor] = {}     # trainer.logged_metrics
        self.progress: dict[str, float] = {}          # trainer.progress_bar_metrics
        self.batch: Any = None                        # the current batch, for batch-size inference
        self.dl_idx: int | None = None                # the running eval loader when there are several
        self._reduce_fn = reduce_fn                   # cross-rank reduction (None: one process)
        self.eval_steps: dict[tuple, int] = {}        # (loop, loader) -> eval batches logged: the logger's eval step
        self._context = self.TRAIN_EPOCH
        self._active = self.results["train"]
        self.context = self.TRAIN_STEP
        self._pending: dict[str, tuple[list, list]] = {}  # a mid-epoch checkpoint's values, until logged again

    @property
    def context(self) -> tuple:
        """(default on_step, default on_epoch, results name) of the running loop; the loops set it.

        Entering a loop's batches starts its results afresh (training: a new epoch after the last one's
        values were logged; an eval loop: every run); leaving training's batches keeps their last step values.
        """
        return self._context

    @context.setter
    def context(self, ctx: tuple) -> None:
        previous, self._context = self._context, ctx
        self._active = self.results[ctx[2]]
        train = self.results["train"]
        if previous[2] == "train" and train.in_batch and ctx is not self.TRAIN_STEP:
            self.merge(*self.metrics(train, on_step=True))
        if ctx is self.TRAIN_STEP:
            if not train.in_batch:
                train.reset()
                train.in_batch = True
        elif ctx is self.TRAIN_EPOCH:
            train.in_batch = False
        elif ctx[2] != previous[2]:
            results = self.results[ctx[2]]
            results.reset()
            results.in_batch = True

    def next_eval_step(self, acc_name: str) -> int:
        key = (acc_name, self.dl_idx)
        step = self.eval_steps.get(key, 0)
        self.eval_steps[key] = step + 1
        return step

    def context_for(self, acc_name: str | None) -> tuple:
        return {"val": self.VAL, "test": self.TEST}.get(acc_name, self.PREDICT)

    @property
    def active(self) -> Results:
        return self._active

    # -- the hot path ------------------------------------------------------------------
    def log(self, fx: str | None, name: str, value: Any, prog_bar: bool, logger: bool | None, on_step: bool | None,
            on_epoch: bool | None, reduce_fx: Any, enable_graph: bool, sync_dist: bool, sync_dist_group: Any,
            add_dataloader_idx: bool, batch_size: int | None, metric: Any, rank_zero_only: bool) -> None:
        results = self._active
        dl_idx = None if results.training else self.dl_idx
        key = (fx, name, dl_idx if add_dataloader_idx else None)
        raw = (prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, add_dataloader_idx, dl_idx, sync_dist,
               sync_dist_group, rank_zero_only)
        entry = results.entries.get(key)
        if entry is None or entry.raw != raw:  # first time, or other arguments: check them (a repeat call skips this)
            entry = self._checked_entry(results, key, raw, metric)
        entry.has_reset = False
        entry.computed = None
        if metric is not None:  # a torchmetrics.Metric: it keeps its own state; Lightning reads its forward cache
            entry.metric = metric
            if entry.on_step:
                entry.step_value = metric._forward_cache
            return
        detached = value.detach()
        if entry.on_step:
            if entry.sync:  # reduced across ranks now, with reduce_fx as the op (every rank logs, as Lightning)
                entry.step_value = self._sync(entry, detached.to(float_dtype()), entry.reduce)
            else:
                entry.step_value = value if enable_graph else detached
        if entry.on_epoch:
            entry.values.append(detached)
            if entry.reduce == "mean":
                if batch_size is None:
                    batch_size = batch_size_of(self.batch) if self.batch is not None else 1
                entry.sizes.append(batch_size)

    def _checked_entry(self, results: Results, key: tuple, raw: tuple, metric: Any) -> Entry:
        """Lightning's checks of a ``self.log`` call in hook ``fx``; a new entry, or the existing one if the options
        (after defaults) are the same."""
        fx, name, _ = key
        prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, add_dl, dl_idx, sync_dist, group, rank0 = raw
        rules = FX_RULES.get(fx) if fx is not None else None
        if rules is None:
            if fx is not None:
                raise MisconfigurationException(
                    f"You can't `self.log()` inside `{fx}`. HINT: You can still log directly to the logger by using"
                    " `self.logger.experiment`.")
            # called from code the stack does not name (a step assigned under another name): the loop's defaults
            rules = (self.context[0], self.context[1], _ANY, _ANY)
        on_step = rules[0] if on_step is None else on_step
        on_epoch = rules[1] if on_epoch is None else on_epoch
        if on_step not in rules[2]:
            raise MisconfigurationException(
                f"You can't `self.log(on_step={on_step})` inside `{fx}`, must be one of {rules[2]}.")
        if on_epoch not in rules[3]:
            raise MisconfigurationException(
                f"You can't `self.log(on_epoch={on_epoch})` inside `{fx}`, must be one of {rules[3]}.")
        if not on_step and not on_epoch:
            raise MisconfigurationException("`self.log(on_step=False, on_epoch=False)` is not useful.")
        logger = True if logger is None else bool(logger)
        sync = bool(sync_dist) and self._reduce_fn is not None and not rank0
        options = (bool(prog_bar), logger, on_step, on_epoch, reduce_name(reduce_fx), enable_graph, add_dl, dl_idx,
                   sync, group, rank0)
        entry = results.entries.get(key)
        if entry is not None:
            if entry.options != options:
                raise MisconfigurationException(
                    f"You called `self.log({name}, ...)` twice in `{fx}` with different arguments. This is not allowed")
            entry.raw = raw
            return entry
        entry = results.entries[key] = Entry(fx, name, options, bool(prog_bar), logger, on_step, on_epoch, options[4],
                                             enable_graph, add_dl, dl_idx, sync, group, metric)
        entry.raw = raw
        if self._pending and results.training:  # values from a mid-epoch checkpoint join their entry
            saved = self._pending.pop(name if fx == "training_step" else f"{fx}.{name}", None)
            if saved is not None:
                entry.values, entry.sizes = saved
        return entry

    # -- values ----------------------------------------------------------------------------
    def _sync(self, entry: Entry, tensor: torch.Tensor, op: str) -> torch.Tensor:
        if not entry.sync:
            return tensor
        if entry.group is not None:
            import torch.distributed as dist
            red = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                   "min": dist.ReduceOp.MIN}[op]
            tensor = tensor.clone()
            dist.all_reduce(tensor, op=red, group=entry.group)
            return tensor / dist.get_world_size(entry.group) if op == "mean" else tensor
        return self._reduce_fn(tensor, op)

    def _epoch_value(self, entry: Entry) -> torch.Tensor | None:
        if entry.computed is not None:
            return entry.computed
        if entry.metric is not None:
            entry.computed = entry.metric.compute()
            return entry.computed
        if not entry.values:
            return None
        dtype = float_dtype()
        vals = torch.stack([v.to(dtype) for v in entry.values])
        if entry.reduce == "mean":
            sizes = torch.tensor(entry.sizes, dtype=dtype, device=vals.device)
            num, den = self._sync(entry, (vals * sizes).sum(), "sum"), self._sync(entry, sizes.sum(), "sum")
            value = num / den
        else:
            value = self._sync(entry, getattr(vals, entry.reduce)(), entry.reduce)
        entry.computed = value
        return value

    def _step_value(self, entry: Entry) -> torch.Tensor | None:
        v = entry.step_value
        if v is None:
            return None
        if v.dtype is not torch.float32 and v.dtype is not torch.float64:
            v = v.to(float_dtype())
        return v

    def metrics(self, results: Results, on_step: bool, dl_idx: Any = "current") -> tuple[dict, dict, dict]:
        """(callback, log, progress bar) values of ``results`` at step or epoch level, as Lightning builds them.

        ``dl_idx``: only entries of that loader (Lightning reads one loader at a time); ``"all"``: every entry.
        """
        callback: dict[str, torch.Tensor] = {}
        log: dict[str, torch.Tensor] = {}
        pbar: dict[str, Any] = {}
        want = self.dl_idx if dl_idx == "current" and not results.training else dl_idx
        for e in results.entries.values():
            if e.has_reset or (want != "all" and not results.training and e.dl_idx != want):
                continue
            if on_step:
                value = self._step_value(e) if e.on_step else None
            else:
                value = self._epoch_value(e) if e.on_epoch else None
            if value is None:
                continue
            if not e.enable_graph:
                value = value.detach()
            name, forked = e.names(on_step)
            if e.logger:
                log[forked] = value
            if results.training or (e.on_epoch and not on_step):
                callback[name] = value
                callback[forked] = value
            if e.prog_bar:
                pbar[forked] = value
        return callback, log, pbar

    def merge(self, callback: dict, log: dict, pbar: dict) -> None:
        self.callback.update(callback)
        self.logged.update(log)
        if pbar:
            floats = to_floats(list(pbar.values()))
            self.progress.update(zip(pbar, floats))

    def live(self) -> tuple[dict, dict, dict]:
        """The running loop's current values (step values inside a batch loop, else epoch values)."""
        results = self.active
        if not results.entries:
            return {}, {}, {}
        return self.metrics(results, on_step=results.in_batch)

    def callback_metrics(self) -> dict[str, torch.Tensor]:
        callback, _, _ = self.live()
        self.callback.update(callback)
        return self.callback

    def logged_metrics(self) -> dict[str, torch.Tensor]:
        _, log, _ = self.live()
        self.logged.update(log)
        return self.logged

    def progress_bar_metrics(self) -> dict[str, float]:
        _, _, pbar = self.live()
        if pbar:
            self.progress.update(zip(pbar, to_floats(list(pbar.values()))))
        return self.progress

    # -- the loops' events -------------------------------------------------------------------
    def step_metrics(self, acc_name: str = "train") -> dict[str, float]:
        """The latest step values of a loop, merged into the trainer's dicts; returns the logger's floats."""
        results = self.results[acc_name]
        if not results.in_batch:  # between an epoch's end and the next: the epoch values stand
            return {}
        callback, log, pbar = self.metrics(results, on_step=True)
        self.merge(callback, log, pbar)
        return dict(zip(log, to_floats(list(log.values())))) if log else {}

    def epoch_metrics(self, acc_name: str, dl_idx: Any = "all") -> dict[str, torch.Tensor]:
        """A loop's epoch values, merged into the trainer's dicts; returns the logger's tensors."""
        results = self.results[acc_name]
        if results.in_batch and results.training:  # the last step values stay visible after the epoch
            self.merge(*self.metrics(results, on_step=True))
        results.in_batch = False
        callback, log, pbar = self.metrics(results, on_step=False, dl_idx=dl_idx)
        self.merge(callback, log, pbar)
        return log

    def reduce_epoch(self, acc_name: str) -> dict[str, float]:
        """The epoch values of a loop as floats for the logger (the trainer's dicts updated too)."""
        log = self.epoch_metrics(acc_name)
        return dict(zip(log, to_floats(list(log.values())))) if log else {}

    def reset(self, acc_name: str) -> None:
        self.results[acc_name].reset()

    def discard_sanity(self, acc_name: str) -> None:
        """After the sanity check nothing it logged remains, not even in the trainer-wide dicts (Lightning's reset)."""
        self.results[acc_name].reset()
        self.callback, self.logged, self.progress = {}, {}, {}

    def eval_outputs(self, acc_name: str, n_loaders: int) -> list[dict[str, torch.Tensor]]:
        """Per loader, the epoch values logged while it ran, plus those of the epoch-end hooks (no loader)."""
        results = self.results[acc_name]
        results.in_batch = False
        shared = self.metrics(results, on_step=False, dl_idx=None)
        self.merge(*shared)
        if n_loaders <= 1:
            return [dict(shared[1])] if n_loaders == 1 else []
        outs = []
        for i in range(n_loaders):
            callback, log, pbar = self.metrics(results, on_step=False, dl_idx=i)
            self.merge(callback, log, pbar)
            outs.append({**log, **shared[1]})
        return outs

    # -- checkpoints: the running epoch values, so a mid-epoch resume reports the same epoch means
    def export_acc(self, acc_name: str) -> dict[str, tuple[list[float], list[int]]]:
        out = {}
        for (fx, name, dl), e in self.results[acc_name].entries.items():
            if e.values and e.metric is None:
                out[name if fx == "training_step" else f"{fx}.{name}"] = (to_floats(e.values), list(e.sizes))
        return out

    def import_acc(self, acc_name: str, saved: dict[str, tuple[list[float], list[int]]]) -> None:
        """Values logged before the checkpoint; each joins its entry when the name is logged again."""
        self._pending = {k: ([torch.tensor(v) for v in vals], list(sizes)) for k, (vals, sizes) in saved.items()}

    @staticmethod
    def cpu_copy(values: dict[str, Any]) -> dict[str, Any]:
        return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}

    def teardown(self) -> None:
        """After a stage: the trainer-wide dicts hold the last values, on the CPU; the loops' results are gone."""
        self.callback_metrics()
        self.logged_metrics()
        self.progress_bar_metrics()
        for r in self.results.values():
            r.entries.clear()
            r.in_batch = False
        self.callback = self.cpu_copy(self.callback)
        self.logged = self.cpu_copy(self.logged)

    def load_result(self, callback_metrics: dict[str, Any], logged: dict[str, Any]) -> None:
        """Take the metrics a rank-0 process sent back (multi-process fit)."""
        for r in self.results.values():
            r.entries.clear()
        self.callback = dict(callback_metrics)
        self.logged = dict(logged)


def to_floats(values: list) -> list[float]:
    """Many 0-dim tensors (or numbers) to floats with one host sync."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [float(v) for v in values]
    device = tensors[0].device
    return torch.stack([
        (v.detach().to(torch.float64).reshape(()) if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)).to(device)
        for v in values]).tolist()


def attach_callback_logging(callbacks: list, module: Any) -> None:
    """``self.log`` / ``self.log_dict`` inside a callback log through the module, as Lightning attaches them."""
    for cb in callbacks:
        cb.log = module.log
        cb.log_dict = module.log_dict
