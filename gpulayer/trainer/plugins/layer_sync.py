"""Layer sync plugins: ``TorchSyncBatchNorm`` turns every BatchNorm of a model into ``torch.nn.SyncBatchNorm``
(``Trainer(sync_batchnorm=True)`` in a multi-process run) and back."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch.nn.modules.batchnorm import _BatchNorm


class LayerSync(ABC):
    """Swaps a model's layers for ones that synchronize across processes (``apply``) and back (``revert``)."""

    @abstractmethod
    def apply(self, model: torch.nn.Module) -> torch.nn.Module: ...

    @abstractmethod
    def revert(self, model: torch.nn.Module) -> torch.nn.Module: ...


class _AnyDimBatchNorm(_BatchNorm):
    """What a reverted ``SyncBatchNorm`` becomes: a BatchNorm accepting any input rank, as SyncBatchNorm did."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")


class TorchSyncBatchNorm(LayerSync):
    """``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` and its inverse."""

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def revert(self, model: torch.nn.Module) -> torch.nn.Module:
        converted = model
        if isinstance(model, torch.nn.SyncBatchNorm):
            converted = _AnyDimBatchNorm(model.num_features, model.eps, model.momentum, model.affine,
                                         model.track_running_stats)
            if model.affine:
                with torch.no_grad():
                    converted.weight = model.weight
                    converted.bias = model.bias
            converted.running_mean = model.running_mean
            converted.running_var = model.running_var
            converted.num_batches_tracked = model.num_batches_tracked
            if hasattr(model, "qconfig"):
                converted.qconfig = model.qconfig
        for name, child in model.named_children():
            converted.add_module(name, self.revert(child))
        return converted
