"""``PyTorchProfiler``: ``torch.profiler``'s operator view of a run (``Trainer(profiler="pytorch")``).

Every action the Trainer names (hooks, steps, fetches) becomes a ``record_function`` called
``[pl][profile]<action>``, and each submodule's forward one called ``[pl][module]<class>: <name>``
(``record_module_names``). The summary is torch's ``key_averages().table()``; with ``dirpath`` set,
each recorded cycle is also written as a Chrome trace, ``<stage>-<filename>-<action>.<ns>.pt.trace.json``.

The schedule (default: wait 1, warm up 1, record 3) counts each kind of step on its own, so the
validation that runs between training steps neither advances nor ends the training cycle; each kind
records one cycle per stage. A stage too short for the default schedule (under 5 steps) is recorded whole.

>>> trainer = Trainer(profiler=PyTorchProfiler(dirpath="prof", filename="perf"))  # doctest: +SKIP
>>> trainer.fit(model)  # prof/fit-perf.txt and prof/fit-perf-[Strategy]...training_step.*.pt.trace.json  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable

import torch
from torch import nn
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerAction, ProfilerActivity, record_function, tensorboard_trace_handler

from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.profilers.profiler import Profiler
from gpulayer.trainer.utilities.rank_zero import WarningCache, rank_zero_warn

__all__ = ["PyTorchProfiler", "RegisterRecordFunction"]

_KINETO_AVAILABLE = torch.profiler.kineto_available()
warning_cache = WarningCache()

_STEP_KINDS = {"training_step": "train", "validation_step": "val", "test_step": "test", "predict_step": "predict"}
_DEFAULT_SCHEDULE_STEPS = 5  # wait=1 + warmup=1 + active=3


def _record_always(step: int) -> ProfilerAction:
    """The schedule of a stage too short for the default one: everything is recorded."""
    return ProfilerAction.RECORD


class RegisterRecordFunction:
    """Inside ``with``, each submodule's forward is a ``record_function``: ``[pl][module]<module.Class>: <name>``.

    >>> with profiler.profile("a"), RegisterRecordFunction(model):  # doctest: +SKIP
    ...     model(batch)
    """

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._handles: list[Any] = []
        self._open: dict[str, list[record_function]] = {}  # a list: a module may run inside itself

    def _enter(self, label: str, *_: Any) -> None:
        rec = record_function(label)
        rec.__enter__()
        self._open.setdefault(label, []).append(rec)

    def _exit(self, label: str, *_: Any) -> None:
        stack = self._open.get(label)
        if stack:
            stack.pop().__exit__(None, None, None)

    def __enter__(self) -> "RegisterRecordFunction":
        for name, module in self._model.named_modules():
            if not name:  # the model itself: its step is recorded under the step's own action
                continue
            label = f"[pl][module]{type(module).__module__}.{type(module).__name__}: {name}"
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._enter, label)))
            self._handles.append(module.register_forward_hook(functools.partial(self._exit, label)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for stack in self._open.values():  # a forward that raised left its range open
            while stack:
                stack.pop().__exit__(None, None, None)
        self._open = {}


class _StepSchedule:
    """The user's schedule over a count per kind of step (train, val, test, predict) instead of torch's one counter."""

    def __init__(self, schedule: Callable[[int], ProfilerAction], is_default: bool) -> None:
        self.schedule, self.is_default = schedule, is_default
        self.reset()

    def reset(self, stage: str | None = None) -> None:
        self.stage = stage
        self.counts = dict.fromkeys(_STEP_KINDS.values(), 0)
        self.finished: set[str] = set()  # kinds whose cycle has been saved: one per stage
        self.kind: str | None = None
        self.last: ProfilerAction | None = None

    def advance(self, kind: str) -> None:
        """A step of ``kind`` ended: the next call decides what the profiler does until the next one ends."""
        self.kind = kind
        # a fit's sanity check is not the fit's validation: its steps do not count
        if not (self.stage == "fit" and kind == "val" and self.counts["train"] == 0):
            self.counts[kind] += 1

    @property
    def num_step(self) -> int:
        return self.counts.get(self.kind, 0) if self.kind else 0

    def __call__(self, _torch_step: int) -> ProfilerAction:
        if self.kind is None or self.kind in self.finished:
            return ProfilerAction.NONE
        action = self.schedule(self.counts[self.kind])
        if self.last == ProfilerAction.RECORD and action == ProfilerAction.WARMUP:
            # validation recording when training resumes in its warm-up: torch refuses RECORD -> WARMUP
            action = ProfilerAction.RECORD
        if action == ProfilerAction.RECORD_AND_SAVE:
            self.finished.add(self.kind)
        self.last = action
        return action


def _default_schedule() -> Callable[[int], ProfilerAction]:
    return torch.profiler.schedule(wait=1, warmup=1, active=3)


class PyTorchProfiler(Profiler):
    """``torch.profiler.profile`` around the stage: operators, their time and memory, per action and module.

    Args:
        dirpath, filename: where the summary (``<stage>-<filename>.txt``) and the traces go; ``dirpath``
            defaults to the Trainer's ``log_dir``. Without ``filename`` the summary goes to the log.
        group_by_input_shapes: group the table by input shape (needs ``record_shapes=True``).
        emit_nvtx: emit NVTX ranges for ``nsys``/``nvprof`` instead of recording (needs CUDA).
        export_to_chrome: write each recorded cycle as a Chrome trace under ``dirpath``.
        row_limit: rows of the summary table (-1: all).
        sort_by_key: one of ``AVAILABLE_SORT_KEYS``; default ``cuda_time_total`` when CUDA is profiled, else
            ``cpu_time_total``.
        record_module_names: a ``record_function`` per submodule forward (``RegisterRecordFunction``).
        table_kwargs: more arguments of ``EventList.table`` (``max_name_column_width``...).
        **profiler_kwargs: ``torch.profiler.profile``'s (``schedule``, ``activities``, ``record_shapes``,
            ``profile_memory``, ``with_stack``, ``on_trace_ready``...); ``export_to_flame_graph=True`` writes
            ``.stack`` files of ``metric`` (default ``self_cpu_time_total``).
    """

    STEP_FUNCTIONS = set(_STEP_KINDS)
    AVAILABLE_SORT_KEYS = {"cpu_time", "cuda_time", "cpu_time_total", "cuda_time_total", "cpu_memory_usage",
                           "cuda_memory_usage", "self_cpu_memory_usage", "self_cuda_memory_usage", "count"}

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None,
                 group_by_input_shapes: bool = False, emit_nvtx: bool = False, export_to_chrome: bool = True,
                 row_limit: int = 20, sort_by_key: str | None = None, record_module_names: bool = True,
                 table_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self._group_by_input_shapes = group_by_input_shapes and profiler_kwargs.get("record_shapes", False)
        self._emit_nvtx = emit_nvtx
        self._export_to_chrome = export_to_chrome
        self._row_limit = row_limit
        self._sort_by_key = sort_by_key or _default_sort_key(profiler_kwargs)
        self._record_module_names = record_module_names
        self._table_kwargs = dict(table_kwargs or {})
        self._export_to_flame_graph = profiler_kwargs.pop("export_to_flame_graph", False)
        self._metric = profiler_kwargs.pop("metric", "self_cpu_time_total")
        self._has_on_trace_ready = "on_trace_ready" in profiler_kwargs
        self._profiler_kwargs = profiler_kwargs
        self._schedule: _StepSchedule | None = None
        if self._sort_by_key not in self.AVAILABLE_SORT_KEYS:
            raise MisconfigurationException(
                f"Found sort_by_key: {self._sort_by_key}. Should be within {self.AVAILABLE_SORT_KEYS}. ")
        _check_table_kwargs(self._table_kwargs)
        if _KINETO_AVAILABLE:
            self._schedule = self._make_schedule(profiler_kwargs)
            profiler_kwargs["schedule"] = self._schedule  # None: torch's own, everything recorded
            profiler_kwargs["activities"] = profiler_kwargs.get("activities") or _default_activities()
            profiler_kwargs["with_stack"] = profiler_kwargs.get("with_stack", False) or self._export_to_flame_graph

        self.profiler: Any = None  # the torch profiler of the stage running
        self.function_events: EventList | None = None  # what the last stage recorded (kept after it)
        self._register: RegisterRecordFunction | None = None
        self._nvtx_range: Any = None  # torch.cuda.profiler.profile() around emit_nvtx
        self._recording_map: dict[str, record_function] = {}

    @staticmethod
    def _make_schedule(kwargs: dict[str, Any]) -> _StepSchedule | None:
        if "schedule" not in kwargs:
            return _StepSchedule(_default_schedule(), is_default=True)
        schedule = kwargs["schedule"]
        if schedule is None:
            return None
        if not callable(schedule):
            raise MisconfigurationException(f"Schedule should be a callable. Found: {schedule}")
        action = schedule(0)
        if not isinstance(action, ProfilerAction):
            raise MisconfigurationException(f"Schedule should return a `torch.profiler.ProfilerAction`. Found: {action}")
        return _StepSchedule(schedule, is_default=False)

    # -- recording ------------------------------------------------------------------------------
    def start(self, action_name: str) -> None:
        if self.profiler is None:
            self._open_profiler()
        if self._lightning_module is not None and self._register is None and self._record_module_names:
            self._register = RegisterRecordFunction(self._lightning_module)
            self._register.__enter__()
        if action_name not in self._recording_map:
            recording = record_function("[pl][profile]" + action_name)
            recording.__enter__()
            self._recording_map[action_name] = recording

    def stop(self, action_name: str) -> None:
        recording = self._recording_map.pop(action_name, None)
        if recording is not None:
            recording.__exit__(None, None, None)
        if not _KINETO_AVAILABLE or self._emit_nvtx or self.profiler is None:
            return
        kind = next((k for fn, k in _STEP_KINDS.items() if action_name.endswith(fn)), None)
        if kind is not None:
            self._step(action_name, kind)

    def _open_profiler(self) -> None:
        if torch.autograd._profiler_enabled():  # another profiler's stage was never described: ours takes over
            torch.autograd._disable_profiler()
        if self._schedule is not None:
            self._schedule.reset(self._stage)
        if self._emit_nvtx:
            if not torch.cuda.is_available():
                raise MisconfigurationException(
                    "PyTorchProfiler(emit_nvtx=True) emits NVTX ranges for CUDA profilers, but CUDA is not available "
                    "here; run on a GPU machine, or pass emit_nvtx=False to record with torch.profiler")
            self._nvtx_range = torch.cuda.profiler.profile()
            self._nvtx_range.__enter__()
            self.profiler = self._build(torch.autograd.profiler.emit_nvtx)
        else:
            self.profiler = self._build(torch.profiler.profile if _KINETO_AVAILABLE
                                        else torch.autograd.profiler.profile)
        entered = self.profiler.__enter__()
        self.profiler = entered if entered is not None else self.profiler

    def _build(self, cls: type) -> Any:
        accepted = inspect.signature(cls.__init__).parameters
        return cls(**{k: v for k, v in self._profiler_kwargs.items() if k in accepted})

    def _step(self, action_name: str, kind: str) -> None:
        """A step ended: torch.profiler moves along its schedule, and a finished cycle is written out."""
        schedule = self._schedule
        if schedule is not None:
            schedule.advance(kind)
            if schedule.is_default and self._total_steps(kind) < _DEFAULT_SCHEDULE_STEPS:
                warning_cache.warn("The PyTorch Profiler default schedule will be overridden as there is not enough "
                                   "steps to properly record traces.")
                self._schedule = schedule = None
                self.profiler.schedule = _record_always
        if not self._has_on_trace_ready:
            self.profiler.on_trace_ready = functools.partial(self._write_trace, action_name)
        if schedule is not None:
            self.profiler.step_num = schedule.num_step
        self.profiler.step()

    def _total_steps(self, kind: str) -> float:
        """The steps of ``kind`` this stage runs (the sanity check's too, for a fit's validation)."""
        trainer = getattr(self._lightning_module, "trainer", None)
        if trainer is None:
            return float("inf")

        def total(value: Any) -> float:
            return sum(value) if isinstance(value, (list, tuple)) else (value or 0)

        if kind == "train":
            return total(trainer.num_training_batches)
        if kind == "val":
            return total(trainer.num_val_batches) + total(trainer.num_sanity_val_batches)
        return total(getattr(trainer, f"num_{'test' if kind == 'test' else 'predict'}_batches"))

    def _write_trace(self, action_name: str, profiler: Any) -> None:
        if self.dirpath is None:
            rank_zero_warn("The PyTorchProfiler failed to export trace as `dirpath` is None")
            return
        if self._export_to_chrome:
            name = self._prepare_filename(action_name=action_name, extension="")
            tensorboard_trace_handler(str(self.dirpath), name)(profiler)
        if self._export_to_flame_graph:
            path = os.path.join(self.dirpath, self._prepare_filename(action_name=action_name, extension=".stack"))
            profiler.export_stacks(path, metric=self._metric)

    # -- report ---------------------------------------------------------------------------------
    def summary(self) -> str:
        if not self._profiler_kwargs.get("enabled", True) or self._emit_nvtx:
            return ""
        self._close_profiler()
        if not self.function_events:
            return ""
        if self._export_to_chrome and not _KINETO_AVAILABLE:  # the legacy profiler has no trace handler
            path = f"{self.local_rank}_trace.json"
            self.function_events.export_chrome_trace(path if self.dirpath is None else os.path.join(self.dirpath, path))
        averages = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes)
        table = averages.table(sort_by=self._sort_by_key, row_limit=self._row_limit, **self._table_kwargs)
        return self._stats_to_str({"records": table})

    def _close_profiler(self) -> None:
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            if not self._emit_nvtx:
                self.function_events = self.profiler.events() if _KINETO_AVAILABLE else self.profiler.function_events
            self.profiler = None
        if self._schedule is not None:
            self._schedule.reset()
        if self._nvtx_range is not None:
            self._nvtx_range.__exit__(None, None, None)
            self._nvtx_range = None
        if self._register is not None:
            self._register.__exit__(None, None, None)
            self._register = None

    def teardown(self, stage: str | None) -> None:
        self._close_profiler()
        for recording in self._recording_map.values():  # actions a failed stage left open
            recording.__exit__(None, None, None)
        self._recording_map = {}
        super().teardown(stage=stage)

    def __getstate__(self) -> dict[str, Any]:
        # a copy travels to the ranks before any stage: what is running stays here
        return {**super().__getstate__(), "profiler": None, "_register": None, "_nvtx_range": None,
                "_recording_map": {}}


def _check_table_kwargs(table_kwargs: dict[str, Any]) -> None:
    valid = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
    for key in table_kwargs:
        if key in {"sort_by", "row_limit"}:
            raise KeyError(f"Found invalid table_kwargs key: {key}. This is already a positional argument of the "
                           "Profiler.")
        if key not in valid:
            raise KeyError(f"Found invalid table_kwargs key: {key}. Should be within {valid}.")


def _default_activities() -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def _default_sort_key(profiler_kwargs: dict[str, Any]) -> str:
    activities = profiler_kwargs.get("activities")
    cuda = (profiler_kwargs.get("use_cuda", False) or (activities and ProfilerActivity.CUDA in activities)
            or (not activities and torch.cuda.is_available()))
    return "cuda_time_total" if cuda else "cpu_time_total"
