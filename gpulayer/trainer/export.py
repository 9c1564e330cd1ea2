"""Exporting a module for inference: ``to_torchscript`` and ``to_onnx`` (Lightning's ``LightningModule`` methods).

Both compile ``forward`` only; the training hooks stay behind. An input for tracing comes from the argument or
from ``example_input_array`` and goes through the module's own batch-transfer hooks, so it reaches the device the
module is on, as a batch would in a fit. The module's training mode is what it was before the export.

TorchScript reads every attribute of the module it compiles and compiles its properties: the Trainer-facing
properties (``trainer``, ``logger``, ``global_step``, ...) are listed in ``__jit_unused_properties__`` for each
subclass, and while scripting runs the ``trainer`` property answers ``None`` instead of raising (a module being
exported need not be attached to a Trainer).
"""

from __future__ import annotations

import contextlib
import os
from io import BytesIO
from typing import Any, Iterator

import torch

from gpulayer.trainer.utilities.cloud_io import get_filesystem
from gpulayer.trainer.utilities.imports import _available
from gpulayer.trainer.utilities.rank_zero import rank_zero_deprecation

_ONNX_AVAILABLE = _available("onnx")
_ONNXSCRIPT_AVAILABLE = _available("onnxscript")

_TORCHSCRIPT_DEPRECATION = (
    "`LightningModule.to_torchscript` has been deprecated in v2.7 and will be removed in v2.8. TorchScript is "
    "deprecated in PyTorch. Use `torch.export.export()` for model exporting instead. See "
    "https://pytorch.org/docs/stable/export.html for more information.")


def _own_properties(cls: type) -> list[str]:
    """Names of the properties gpulayer's own classes in ``cls``'s MRO define (a user's properties still compile)."""
    return sorted({name for base in cls.__mro__ if base.__module__.startswith("gpulayer.trainer.")
                   for name, value in vars(base).items() if isinstance(value, property)})


class ExportMixin:
    """``example_input_array``, ``to_torchscript`` and ``to_onnx`` for ``Module``."""

    _jit_is_scripting = False  # a class attribute: every module, nested ones included, sees it while scripting
    __jit_unused_properties__: list[str] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # what the class body lists itself (Lightning users extend the list) and what the bases left out stay out
        inherited = {name for base in cls.__mro__[1:] for name in getattr(base, "__jit_unused_properties__", [])}
        declared = set(vars(cls).get("__jit_unused_properties__", []))
        cls.__jit_unused_properties__ = sorted(inherited | declared | set(_own_properties(cls)))

    @property
    def example_input_array(self) -> Any:
        """An input ``forward`` accepts: a tensor (``forward(x)``), a tuple (``forward(*x)``) or a dict
        (``forward(**x)``). Exports trace with it when given none."""
        return self.__dict__.get("_example_input_array")

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self.__dict__["_example_input_array"] = example

    def _batch_on_device(self, sample: Any) -> Any:
        """``sample`` as the module would see it as a batch: its transfer hooks applied, on its device."""
        sample = self.on_before_batch_transfer(sample, 0)
        sample = self.transfer_batch_to_device(sample, self.device, 0)
        return self.on_after_batch_transfer(sample, 0)

    @torch.no_grad()
    def to_torchscript(self, file_path: str | os.PathLike | None = None, method: str | None = "script",
                       example_inputs: Any = None, **kwargs: Any) -> Any:
        """This module as a ``torch.jit.ScriptModule`` (in eval mode), saved to ``file_path`` when given (any
        fsspec path). ``method="trace"`` traces with ``example_inputs`` (default: ``example_input_array``);
        ``kwargs`` go to ``torch.jit.script`` / ``torch.jit.trace``. Deprecated, as in Lightning 2.7.

        >>> script = model.to_torchscript(file_path="model.pt")   # doctest: +SKIP
        """
        rank_zero_deprecation(_TORCHSCRIPT_DEPRECATION)
        was_training = self.training
        if method == "script":
            with _jit_scripting():
                compiled = torch.jit.script(self.eval(), **kwargs)
        elif method == "trace":
            if example_inputs is None:
                if self.example_input_array is None:
                    raise ValueError("Choosing method=`trace` requires either `example_inputs` or "
                                     "`model.example_input_array` to be defined.")
                example_inputs = self.example_input_array
            if kwargs.get("check_inputs") is not None:
                kwargs["check_inputs"] = self._batch_on_device(kwargs["check_inputs"])
            with _jit_scripting():
                compiled = torch.jit.trace(func=self.eval(), example_inputs=self._batch_on_device(example_inputs),
                                           **kwargs)
        else:
            raise ValueError(f"The 'method' parameter only supports 'script' or 'trace', but value given was: {method}")
        self.train(was_training)
        if file_path is not None:
            with get_filesystem(file_path).open(os.fspath(file_path), "wb") as f:
                torch.jit.save(compiled, f)
        return compiled

    @torch.no_grad()
    def to_onnx(self, file_path: str | os.PathLike | BytesIO | None = None, input_sample: Any = None,
                **kwargs: Any) -> Any:
        """Export to ONNX with ``torch.onnx.export`` (``kwargs`` go to it), tracing with ``input_sample``
        (default: ``example_input_array``); returns what it returns (an ``ONNXProgram`` with ``dynamo=True``).

        >>> model.to_onnx("model.onnx", torch.randn(1, 64), export_params=True)   # doctest: +SKIP
        """
        if not _ONNX_AVAILABLE:
            raise ModuleNotFoundError(f"`{type(self).__name__}.to_onnx()` requires `onnx` to be installed.")
        if kwargs.get("dynamo", False) and not _ONNXSCRIPT_AVAILABLE:
            raise ModuleNotFoundError(f"`{type(self).__name__}.to_onnx(dynamo=True)` requires `onnxscript` and "
                                      "`torch>=2.5.0` to be installed.")
        was_training = self.training
        if input_sample is None:
            if self.example_input_array is None:
                raise ValueError("Could not export to ONNX since neither `input_sample` nor "
                                 "`model.example_input_array` attribute is set.")
            input_sample = self.example_input_array
        input_sample = self._batch_on_device(input_sample)
        if isinstance(file_path, os.PathLike):
            file_path = os.fspath(file_path)
        exported = torch.onnx.export(self, input_sample, file_path, **kwargs)
        self.train(was_training)
        return exported


@contextlib.contextmanager
def _jit_scripting() -> Iterator[None]:
    """While TorchScript compiles or traces, ``trainer`` of an unattached module answers ``None``."""
    ExportMixin._jit_is_scripting = True
    try:
        yield
    finally:
        ExportMixin._jit_is_scripting = False
