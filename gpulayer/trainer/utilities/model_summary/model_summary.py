"""The model summary: one row per layer (name, type, parameters, mode, FLOPs, in/out sizes), then totals.

``ModelSummary(model, max_depth)`` is Lightning's object of the same name: its properties (``layer_names``,
``param_nums``, ``in_sizes``, ``total_parameters``, ``model_size``, ``total_flops``, ...) and its ``str`` table.
When the model has an ``example_input_array``, one forward in eval mode under ``no_grad`` (and the Trainer's
autocast, if attached) fills the input/output shapes, through a forward hook per layer that removes itself after
its first call, and the FLOPs through torch's ``FlopCounterMode``. The model's train/eval modes are put back after.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from gpulayer.trainer.utilities.rank_zero import WarningCache, rank_zero_warn

PARAMETER_NUM_UNITS = [" ", "K", "M", "B", "T"]
UNKNOWN_SIZE = "?"
LEFTOVER_PARAMS_NAME = "other params"
NOT_APPLICABLE = "n/a"

# bits per parameter for the model-size estimate; a mixed precision keeps fp32 weights (and is warned about)
_PRECISION_BITS = {"64": 64, "64-true": 64, "32": 32, "32-true": 32, "16": 16, "16-true": 16,
                   "bf16": 16, "bf16-true": 16}

warning_cache = WarningCache()


def parse_batch_shape(batch: Any) -> str | list:
    """The shape of a tensor as a list, lists/tuples element by element, ``"?"`` for anything else."""
    if hasattr(batch, "shape"):
        return list(batch.shape)
    if isinstance(batch, (list, tuple)):
        return [parse_batch_shape(item) for item in batch]
    return UNKNOWN_SIZE


def get_human_readable_count(number: int | float) -> str:
    """``123`` -> ``'123  '``, ``1234`` -> ``'1.2 K'``, ``2e6`` -> ``'2.0 M'``, ``4e14`` -> ``'400 T'``,
    ``5e15`` -> ``'5,000 T'`` (no unit beyond trillions)."""
    assert number >= 0, f"get_human_readable_count({number}): the count must be >= 0"
    digits = 1 if number < 1 else int(math.floor(math.log10(number))) + 1
    unit = min((digits - 1) // 3, len(PARAMETER_NUM_UNITS) - 1)
    scaled = number / 10 ** (3 * unit)
    if unit == 0 or scaled >= 100:
        return f"{int(scaled):,d} {PARAMETER_NUM_UNITS[unit]}"
    return f"{scaled:,.1f} {PARAMETER_NUM_UNITS[unit]}"


def get_formatted_model_size(total_model_size: float) -> str:
    """Megabytes with three decimals and thousands separators: ``5500.0`` -> ``'5,500.000'``."""
    return f"{total_model_size:,.3f}"


def _is_dtensor(tensor: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(tensor, DTensor)


def _count(parameters: Any) -> int:
    """Elements of the parameters whose shape is known; a lazy layer's uninitialized ones count 0, with a warning."""
    total = 0
    for p in parameters:
        if isinstance(p, nn.parameter.UninitializedParameter) and not _is_dtensor(p):
            warning_cache.warn(
                "The total number of parameters detected may be inaccurate because the model contains an instance "
                "of `UninitializedParameter`. To get an accurate number, set `self.example_input_array` in your "
                "LightningModule.")
            continue
        total += p.numel()
    return total


class LayerSummary:
    """One layer of the summary: its type, parameter count, mode, and the sizes of its first forward's input
    and output (``"?"`` until it runs; a ``ScriptModule`` takes no hook, so its sizes stay ``"?"``).

    >>> layer = torch.nn.Conv2d(3, 8, 3)
    >>> summary = LayerSummary(layer)
    >>> _ = layer(torch.rand(1, 3, 5, 5))
    >>> summary.num_parameters, summary.in_size, summary.out_size
    (224, [1, 3, 5, 5], [1, 8, 3, 3])
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._in_size: str | list | None = None
        self._out_size: str | list | None = None
        self._hook_handle: RemovableHandle | None = None
        if not isinstance(module, torch.jit.ScriptModule):
            self._hook_handle = module.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, _module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        inputs = (*args, *kwargs.values()) if kwargs else args
        self._in_size = parse_batch_shape(inputs[0] if len(inputs) == 1 else inputs)
        self._out_size = parse_batch_shape(output)
        self.detach_hook()  # a module called again (recurrent use) keeps its first sizes

    def detach_hook(self) -> None:
        """Remove the forward hook if it has not removed itself (the summary calls this once built)."""
        if self._hook_handle is not None:
            self._hook_handle.remove()

    def __del__(self) -> None:
        self.detach_hook()

    @property
    def in_size(self) -> str | list:
        return self._in_size or UNKNOWN_SIZE

    @property
    def out_size(self) -> str | list:
        return self._out_size or UNKNOWN_SIZE

    @property
    def layer_type(self) -> str:
        return type(self._module).__name__

    @property
    def num_parameters(self) -> int:
        return _count(self._module.parameters())

    @property
    def training(self) -> bool:
        return self._module.training


class ModelSummary:
    """The summary of a module's layers to ``max_depth`` (1: its children; -1: every submodule; 0: no rows).

    ``str(summary)`` is the table a fit prints::

          | Name | Type       | Params | Mode  | FLOPs | In sizes  | Out sizes
        ----------------------------------------------------------------------------
        0 | net  | Sequential | 132 K  | train | 2.6 M | [10, 256] | [10, 512]
        ----------------------------------------------------------------------------
        132 K     Trainable params
        ...

    Parameters that belong to no listed layer appear as a last row named ``other params``.
    """

    def __init__(self, model: nn.Module, max_depth: int = 1) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"`max_depth` can be -1, 0 or > 0, got {max_depth}.")
        from torch.utils.flop_counter import FlopCounterMode

        self._model = model
        self._max_depth = max_depth
        self._flop_counter = FlopCounterMode(display=False, depth=max_depth + 1)
        self._layer_summary = self.summarize()
        trainer = getattr(model, "_trainer", None)
        precision = str(trainer.precision) if trainer is not None else "32-true"
        if trainer is not None and precision not in _PRECISION_BITS:
            rank_zero_warn(f"Precision {precision} is not supported by the model summary. "
                           " Estimated model size in MB will not be accurate. Using 32 bits instead.", category=UserWarning)
        self._precision_megabytes = _PRECISION_BITS.get(precision, 32) / 8 * 1e-6

    @property
    def named_modules(self) -> list[tuple[str, nn.Module]]:
        if self._max_depth == 0:
            return []
        if self._max_depth == 1:
            return list(self._model.named_children())
        return list(self._model.named_modules())[1:]  # every submodule, the root left out

    def summarize(self) -> dict[str, LayerSummary]:
        """Build the per-layer summaries, run the example input through the model if it has one."""
        layers = OrderedDict((name, LayerSummary(module)) for name, module in self.named_modules)
        if getattr(self._model, "example_input_array", None) is not None:
            self._forward_example_input()
        for layer in layers.values():
            layer.detach_hook()
        if self._max_depth >= 1:  # named_modules() went to every depth: keep names with < max_depth dots
            layers = OrderedDict((n, s) for n, s in layers.items() if n.count(".") < self._max_depth)
        return layers

    def _forward_example_input(self) -> None:
        model = self._model
        trainer = getattr(model, "_trainer", None)
        batch = model.example_input_array
        if hasattr(model, "transfer_batch_to_device"):  # the module's own batch hooks, as a step's batch goes
            batch = model.on_before_batch_transfer(batch, 0)
            batch = model.transfer_batch_to_device(batch, _device_of(model), 0)
            batch = model.on_after_batch_transfer(batch, 0)
        plugin = getattr(trainer, "precision_plugin", None) if trainer is not None else None
        autocast = plugin.forward_context() if plugin is not None else contextlib.nullcontext()
        modes = {m: m.training for m in model.modules()}
        model.eval()
        try:
            with torch.no_grad(), autocast, self._flop_counter:
                if isinstance(batch, (list, tuple)):
                    model(*batch)
                elif isinstance(batch, dict):
                    model(**batch)
                else:
                    model(batch)
        finally:
            for module, training in modes.items():
                module.training = training

    @property
    def layer_names(self) -> list[str]:
        return list(self._layer_summary)

    @property
    def layer_types(self) -> list[str]:
        return [s.layer_type for s in self._layer_summary.values()]

    @property
    def in_sizes(self) -> list:
        return [s.in_size for s in self._layer_summary.values()]

    @property
    def out_sizes(self) -> list:
        return [s.out_size for s in self._layer_summary.values()]

    @property
    def param_nums(self) -> list[int]:
        return [s.num_parameters for s in self._layer_summary.values()]

    @property
    def training_modes(self) -> list[bool]:
        return [s.training for s in self._layer_summary.values()]

    @property
    def total_training_modes(self) -> dict[str, int]:
        """How many submodules (the root left out) are in train and in eval mode, now."""
        modes = [m.training for m in self._model.modules()][1:]
        return {"train": sum(modes), "eval": len(modes) - sum(modes)}

    @property
    def total_parameters(self) -> int:
        return _count(self._model.parameters())

    @property
    def trainable_parameters(self) -> int:
        return _count(p for p in self._model.parameters() if p.requires_grad)

    @property
    def total_layer_params(self) -> int:
        return sum(self.param_nums)

    @property
    def model_size(self) -> float:
        """Estimated size of the parameters in megabytes, at the Trainer's precision (32 bits without one)."""
        return self.total_parameters * self._precision_megabytes

    @property
    def total_flops(self) -> int:
        return self._flop_counter.get_total_flops()

    @property
    def flop_counts(self) -> dict[str, dict[Any, int]]:
        """Per layer, FLOPs by operator, as the counter saw them under the root's class name."""
        counts = self._flop_counter.get_flop_counts()
        root = type(self._model).__name__
        return {name: dict(counts.get(f"{root}.{name}", {})) for name in self.layer_names}

    def _get_summary_data(self) -> list[tuple[str, list[str]]]:
        """The table's columns, each ``(header, cells)``, every cell a string; Lightning's callbacks take this."""
        columns = [
            (" ", [str(i) for i in range(len(self._layer_summary))]),
            ("Name", self.layer_names),
            ("Type", self.layer_types),
            ("Params", [get_human_readable_count(n) for n in self.param_nums]),
            ("Mode", ["train" if t else "eval" for t in self.training_modes]),
            ("FLOPs", [get_human_readable_count(sum(c.values())) for c in self.flop_counts.values()]),
        ]
        with_sizes = getattr(self._model, "example_input_array", None) is not None
        if with_sizes:
            columns += [("In sizes", [str(s) for s in self.in_sizes]), ("Out sizes", [str(s) for s in self.out_sizes])]
        leftover = self.total_parameters - self.total_layer_params
        if leftover > 0:
            extra = [" ", LEFTOVER_PARAMS_NAME, NOT_APPLICABLE, get_human_readable_count(leftover), NOT_APPLICABLE,
                     NOT_APPLICABLE] + [NOT_APPLICABLE] * (2 if with_sizes else 0)
            for (_, cells), cell in zip(columns, extra):
                cells.append(cell)
        return columns

    def __str__(self) -> str:
        return format_summary_table(self._get_summary_data(), self.total_parameters, self.trainable_parameters,
                                    self.model_size, self.total_training_modes, self.total_flops)

    __repr__ = __str__


def format_summary_table(columns: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                         model_size: float, total_training_modes: dict[str, int], total_flops: int) -> str:
    """The text table of ``columns`` (left-aligned, ``" | "`` between cells) and the totals under it."""
    widths = [max([len(header)] + [len(str(c)) for c in cells]) for header, cells in columns]
    rule = "-" * (sum(widths) + 3 * (len(columns) + 1))
    rows = zip(*(cells for _, cells in columns)) if columns else []
    lines = [" | ".join(f"{h:<{w}}" for (h, _), w in zip(columns, widths)), rule]
    lines += [" | ".join(f"{str(c):<{w}}" for c, w in zip(row, widths)) for row in rows]
    lines.append(rule)
    totals = [
        (get_human_readable_count(trainable_parameters), "Trainable params"),
        (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
        (get_human_readable_count(total_parameters), "Total params"),
        (get_formatted_model_size(model_size), "Total estimated model params size (MB)"),
        (total_training_modes["train"], "Modules in train mode"),
        (total_training_modes["eval"], "Modules in eval mode"),
        (get_human_readable_count(total_flops), "Total Flops"),
    ]
    lines += [f"{str(value):<10}{label}" for value, label in totals]
    return "\n".join(lines)


def _device_of(model: nn.Module) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def summarize(lightning_module: nn.Module, max_depth: int = 1) -> ModelSummary:
    """``ModelSummary(lightning_module, max_depth)``: the summary of the module to that depth (0: no rows)."""
    return ModelSummary(lightning_module, max_depth=max_depth)
