"""Fine-tuning callbacks (Lightning's ``callbacks.finetuning``): freeze parts of a model, unfreeze them later.

``BaseFinetuning`` freezes what ``freeze_before_training`` names when the stage is set up (before
``configure_optimizers``, so an optimizer built over ``requires_grad`` parameters leaves them out), then,
at every train epoch start, calls ``finetune_function(pl_module, epoch, optimizer)`` for each optimizer:
the place to unfreeze modules and give them to the optimizer as a new parameter group
(``unfreeze_and_add_param_group``). The parameter groups it added are part of its state, by parameter
name, so a resumed fit rebuilds them before the optimizer's saved state is loaded into them.

``BackboneFinetuning`` is the ready-made schedule: the module's ``backbone`` frozen until
``unfreeze_backbone_at_epoch``, then trained at a learning rate that grows each epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any, Callable, Union

import torch
from torch.nn import Module, ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn

log = logging.getLogger(__name__)

Modules = Union[Module, Iterable[Any]]  # a module, or an iterable of modules (nested iterables too)


def multiplicative(epoch: int) -> float:
    """``BackboneFinetuning``'s default ``lambda_func``: the backbone's learning rate doubles each epoch."""
    return 2.0


def _param_groups_by_name(groups: list[dict[str, Any]], names: dict[Any, str]) -> list[dict[str, Any]]:
    """``groups`` with each parameter replaced by ``names[parameter]`` (or back, with the inverse mapping)."""
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[p] for p in g["params"]]}
            for g in groups]


class BaseFinetuning(Callback):
    """Override ``freeze_before_training(pl_module)`` and ``finetune_function(pl_module, epoch, optimizer)``.

    >>> class UnfreezeAt(BaseFinetuning):
    ...     def freeze_before_training(self, pl_module):
    ...         self.freeze(pl_module.feature_extractor)
    ...     def finetune_function(self, pl_module, epoch, optimizer):
    ...         if epoch == 10:
    ...             self.unfreeze_and_add_param_group(pl_module.feature_extractor, optimizer)

    ``configure_optimizers`` should then build its optimizers over the trainable parameters only:
    ``Adam(filter(lambda p: p.requires_grad, self.parameters()))``.
    """

    def __init__(self) -> None:
        # per optimizer index: its parameter groups as they were after each epoch start, parameters by name
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False
        self._trainer: Any = None

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restarting = True
        # older checkpoints hold the metadata itself, without the key
        self._internal_optimizer_metadata = state_dict.get("internal_optimizer_metadata", state_dict)
        trainer = self._trainer
        if trainer is not None and trainer.optimizers and trainer.lightning_module is not None:
            # the optimizers exist already: give them their groups now, before their saved state is loaded
            self._restore_param_groups(trainer, trainer.lightning_module)

    def on_fit_start(self, trainer, pl_module) -> None:
        if self._restarting:
            self._restore_param_groups(trainer, pl_module)

    def _restore_param_groups(self, trainer, pl_module) -> None:
        by_name = dict(pl_module.named_parameters())
        for idx, optimizer in enumerate(trainer.optimizers):
            saved = self._internal_optimizer_metadata.get(idx)
            if saved:
                optimizer.param_groups = _param_groups_by_name(saved, by_name)
        self._restarting = False

    def _record(self, pl_module, idx: int, groups_before: int, groups: list[dict[str, Any]]) -> None:
        names = {p: n for n, p in pl_module.named_parameters()}
        if idx not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[idx] = _param_groups_by_name(groups, names)
        elif len(groups) != groups_before:
            self._internal_optimizer_metadata[idx].extend(_param_groups_by_name(groups[groups_before:], names))

    # -- freezing and unfreezing --------------------------------------------------------------------
    @staticmethod
    def flatten_modules(modules: Modules) -> list[Module]:
        """The leaf modules of ``modules`` (and the parents that hold parameters of their own), in order."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable):
            every: Iterable[Module] = [m for sub in modules for m in BaseFinetuning.flatten_modules(sub)]
        else:
            every = modules.modules()
        return [m for m in every if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True, requires_grad: bool = True) -> Iterator[torch.nn.Parameter]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (BatchNorm's skipped unless
        ``train_bn``)."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and not train_bn:
                continue
            for param in mod.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreeze every parameter of ``modules`` (BatchNorm layers track their running statistics again)."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm):
                mod.track_running_stats = True
            for param in mod.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: Module) -> None:
        """Freeze the parameters ``module`` holds itself (a BatchNorm layer also stops tracking statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze ``modules``; with ``train_bn`` their BatchNorm layers stay trainable."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(mod)
            else:
                BaseFinetuning.freeze_module(mod)

    @staticmethod
    def filter_on_optimizer(optimizer: torch.optim.Optimizer, params: Iterable) -> list:
        """``params`` without those ``optimizer`` already updates (with a warning naming the likely cause)."""
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in held]
        if len(kept) != len(params):
            rank_zero_warn(
                "The provided params to be frozen already exist within another group of this optimizer. Those "
                "parameters will be skipped.\nHINT: Did you init your optimizer in `configure_optimizer` as such:\n "
                f"{type(optimizer)}(filter(lambda p: p.requires_grad, self.parameters()), ...) ")
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(modules: Modules, optimizer: torch.optim.Optimizer, lr: float | None = None,
                                     initial_denom_lr: float = 10.0, train_bn: bool = True) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new parameter group.

        Its learning rate: ``lr``, else the first group's divided by ``initial_denom_lr``.
        """
        BaseFinetuning.make_trainable(modules)
        group_lr = float(lr) if lr is not None else optimizer.param_groups[0]["lr"] / initial_denom_lr
        params = BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        params = BaseFinetuning.filter_on_optimizer(optimizer, params)
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})

    # -- hooks ----------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer
        self.freeze_before_training(pl_module)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        for idx, optimizer in enumerate(trainer.optimizers):
            groups_before = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._record(pl_module, idx, groups_before, optimizer.param_groups)

    def finetune_function(self, pl_module, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        """Override: unfreeze what should train from ``epoch`` on (called at every train epoch start)."""
        raise NotImplementedError(f"{type(self).__name__} must implement finetune_function(pl_module, epoch, optimizer)")

    def freeze_before_training(self, pl_module) -> None:
        """Override: freeze what should not train at first (called when the stage is set up)."""
        raise NotImplementedError(f"{type(self).__name__} must implement freeze_before_training(pl_module)")

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_trainer": None}  # a pickled callback does not carry its trainer along


class BackboneFinetuning(BaseFinetuning):
    """Train ``pl_module.backbone`` from ``unfreeze_backbone_at_epoch`` on, at a learning rate that grows.

    At that epoch the backbone joins each optimizer as a new parameter group at ``backbone_initial_lr``
    (default: the optimizer's current rate times ``backbone_initial_ratio_lr``); each later epoch its rate
    is multiplied by ``lambda_func(epoch + 1)``, capped at the optimizer's current rate when
    ``should_align``. ``verbose`` logs both rates (rounded to ``rounding`` digits).

    >>> BackboneFinetuning(unfreeze_backbone_at_epoch=5, lambda_func=lambda epoch: 1.5)  # doctest: +ELLIPSIS
    <...BackboneFinetuning object at ...>
    """

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, lambda_func: Callable = multiplicative,
                 backbone_initial_ratio_lr: float = 10e-2, backbone_initial_lr: float | None = None,
                 should_align: bool = True, initial_denom_lr: float = 10.0, train_bn: bool = True,
                 verbose: bool = False, rounding: int = 12) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def on_fit_start(self, trainer, pl_module) -> None:
        if not isinstance(getattr(pl_module, "backbone", None), Module):
            raise MisconfigurationException("The LightningModule should have a nn.Module `backbone` attribute")
        super().on_fit_start(trainer, pl_module)

    def freeze_before_training(self, pl_module) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        if epoch < self.unfreeze_backbone_at_epoch:
            return
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = self.backbone_initial_lr if self.backbone_initial_lr is not None \
                else current_lr * self.backbone_initial_ratio_lr
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, backbone_lr, train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
        else:
            backbone_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and backbone_lr > current_lr:
                backbone_lr = current_lr  # never faster than the rest of the model
            optimizer.param_groups[-1]["lr"] = backbone_lr
        self.previous_backbone_lr = backbone_lr
        if self.verbose:
            log.info(f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: {round(backbone_lr, self.rounding)}")


__all__ = ["BackboneFinetuning", "BaseFinetuning", "multiplicative"]
