"""``ModelPruning``: prune a module's parameters during training with ``torch.nn.utils.prune`` (Lightning's callback).

At the end of each training epoch (or of each validation epoch with ``prune_on_train_epoch_end=False``) the
callback prunes ``amount`` of the chosen parameters, all together (``use_global_unstructured``, the default: the
smallest weights of the whole set go) or each on its own. torch keeps a pruned parameter as ``<name>_orig`` and a
``<name>_mask`` buffer, and recomputes ``<name>`` before each forward; ``make_pruning_permanent`` folds the mask in
at the end of the fit and in every checkpoint saved meanwhile (training goes on with its masks). With the lottery
ticket hypothesis the unpruned weights go back to their values at the start of the fit (or to fresh ones, with
``resample_parameters``) after each pruning.

>>> ModelPruning("l1_unstructured", amount=lambda epoch: 0.1 if epoch % 2 else 0)   # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import logging
from copy import deepcopy
from typing import Any, Callable, Sequence

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.module import Module
from gpulayer.trainer.utilities.rank_zero import rank_zero_only

log = logging.getLogger(__name__)

# a name, its function (one tensor at a time) and its method class (what global pruning takes)
_BUILTIN = {
    "ln_structured": (torch_prune.ln_structured, torch_prune.LnStructured),
    "l1_unstructured": (torch_prune.l1_unstructured, torch_prune.L1Unstructured),
    "random_structured": (torch_prune.random_structured, torch_prune.RandomStructured),
    "random_unstructured": (torch_prune.random_unstructured, torch_prune.RandomUnstructured),
}
# modules that only hold other modules: their own parameters, if any, are their children's
_CONTAINERS = (Module, nn.Sequential, nn.ModuleList, nn.ModuleDict)

ParameterList = Sequence[tuple[nn.Module, str]]


def _per_epoch(value: Any, epoch: int) -> Any:
    return value(epoch) if callable(value) else value


class ModelPruning(Callback):
    """Prune parameters with ``torch.nn.utils.prune`` as training goes on.

    ``pruning_fn``: a name (``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"``,
    ``"random_structured"``) or a ``BasePruningMethod`` subclass (global pruning only). ``parameters_to_prune``:
    ``(module, "weight")`` pairs; empty means every ``parameter_names`` parameter of every leaf module.
    ``amount``, ``apply_pruning`` and ``use_lottery_ticket_hypothesis`` may be callables of the epoch.
    ``verbose``: 1 logs the overall sparsity after each pruning, 2 also each parameter's.
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(self, pruning_fn: Callable | str, parameters_to_prune: ParameterList = (),
                 parameter_names: list[str] | None = None, use_global_unstructured: bool = True,
                 amount: int | float | Callable[[int], int | float] = 0.5,
                 apply_pruning: bool | Callable[[int], bool] = True, make_pruning_permanent: bool = True,
                 use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
                 resample_parameters: bool = False, pruning_dim: int | None = None, pruning_norm: int | None = None,
                 verbose: int = 0, prune_on_train_epoch_end: bool = True) -> None:
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune = parameters_to_prune
        self._parameter_names = parameter_names or self.PARAMETER_NAMES
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        # id(module) -> {"data": a copy of the module at setup, "names": [(index in _parameters_to_prune, name)]}
        self._original_layers: dict[int, dict[str, Any]] | None = None
        self._method_kwargs: dict[str, Any] = {}  # what a named method needs besides the amount (dim, n)

        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                raise MisconfigurationException(
                    f"The provided `parameter_names` name: {name} isn't in {self.PARAMETER_NAMES}")

        if isinstance(pruning_fn, str):
            pruning_fn = self._resolve_named(pruning_fn.lower(), pruning_dim, pruning_norm)
        elif self._is_pruning_method(pruning_fn):
            if not use_global_unstructured:
                raise MisconfigurationException(
                    "PyTorch `BasePruningMethod` is currently only supported with `use_global_unstructured=True`.")
            self._pruning_method_name = pruning_fn.__name__
        else:
            raise MisconfigurationException(
                f"`pruning_fn` is expected to be a str in {list(_BUILTIN)} or a PyTorch `BasePruningMethod`. "
                f"Found: {pruning_fn}. HINT: if passing a `BasePruningMethod`, pass the class, not an instance")
        if use_global_unstructured and getattr(pruning_fn, "PRUNING_TYPE", None) != "unstructured":
            raise MisconfigurationException(
                'Only the "unstructured" PRUNING_TYPE is supported with `use_global_unstructured=True`. Found method '
                f"{pruning_fn} of type {getattr(pruning_fn, 'PRUNING_TYPE', None)}. ")
        self.pruning_fn = pruning_fn

        if not (isinstance(amount, (int, float)) or callable(amount)):
            raise MisconfigurationException(
                "`amount` should be provided and be either an int, a float or Callable function.")
        self.amount = amount
        if verbose not in (0, 1, 2):
            raise MisconfigurationException("`verbose` must be any of (0, 1, 2)")
        self._verbose = verbose

    def _resolve_named(self, name: str, dim: int | None, norm: int | None) -> Any:
        """The method class (global pruning) or the function (per tensor) a name stands for."""
        if name not in _BUILTIN:
            raise MisconfigurationException(
                f"The provided `pruning_fn` {name} isn't available in PyTorch's built-in functions: {list(_BUILTIN)} ")
        if name.endswith("_structured"):
            if dim is None:
                raise MisconfigurationException(
                    "When requesting `structured` pruning, the `pruning_dim` should be provided.")
            if name == "ln_structured":
                if norm is None:
                    raise MisconfigurationException(
                        "When requesting `ln_structured` pruning, the `pruning_norm` should be provided.")
                self._method_kwargs["n"] = norm
            self._method_kwargs["dim"] = dim
        function, method = _BUILTIN[name]
        chosen = method if self._use_global_unstructured else function
        self._pruning_method_name = chosen.__name__
        return chosen

    @staticmethod
    def _is_pruning_method(method: Any) -> bool:
        return inspect.isclass(method) and issubclass(method, torch_prune.BasePruningMethod)

    def filter_parameters_to_prune(self, parameters_to_prune: ParameterList = ()) -> ParameterList:
        """Override to choose, at setup, which of the ``(module, name)`` pairs get pruned."""
        return parameters_to_prune

    @staticmethod
    def sanitize_parameters_to_prune(pl_module: nn.Module, parameters_to_prune: ParameterList = (),
                                     parameter_names: Sequence[str] = ()) -> ParameterList:
        """The ``(module, name)`` pairs to prune: those given, checked against the model, or, when none are given,
        every parameter called one of ``parameter_names`` (an ``nn.Parameter``) of every leaf module."""
        names = parameter_names or ModelPruning.PARAMETER_NAMES
        leaves = [m for m in pl_module.modules() if not isinstance(m, _CONTAINERS)]
        if not parameters_to_prune:
            return [(m, name) for name in names for m in leaves if isinstance(getattr(m, name, None), nn.Parameter)]
        well_formed = isinstance(parameters_to_prune, (list, tuple)) and all(
            len(pair) == 2 and isinstance(pair[0], nn.Module) and isinstance(pair[1], str)
            for pair in parameters_to_prune)
        if not well_formed:
            raise MisconfigurationException(
                "The provided `parameters_to_prune` should either be list of tuple with 2 elements: "
                "(nn.Module, parameter_name_to_prune) or None")
        missing_modules = [m for m, _ in parameters_to_prune if not any(m is leaf for leaf in leaves)]
        missing_parameters = [n for m, n in parameters_to_prune
                              if any(m is leaf for leaf in leaves) and not hasattr(m, n)]
        if missing_modules or missing_parameters:
            raise MisconfigurationException(
                "Some provided `parameters_to_prune` don't exist in the model. Found missing modules: "
                f"{missing_modules} and missing parameters: {missing_parameters}")
        return parameters_to_prune

    # -- pruning -------------------------------------------------------------------------------
    def apply_pruning(self, amount: int | float) -> None:
        """Prune ``amount`` of ``parameters_to_prune`` now (a fraction, or a number of entries)."""
        before = self._sparsity() if self._verbose else None
        if self._use_global_unstructured:
            accepted = set(inspect.signature(self.pruning_fn).parameters) - {"self"}
            kwargs = {k: v for k, v in {**self._method_kwargs, "amount": amount}.items() if k in accepted}
            torch_prune.global_unstructured(self._parameters_to_prune, pruning_method=self.pruning_fn, **kwargs)
        else:
            for module, name in self._parameters_to_prune:
                self.pruning_fn(module, name=name, amount=amount, **self._method_kwargs)
        if self._verbose:
            self._log_sparsity(before, self._sparsity(), amount)

    def apply_lottery_ticket_hypothesis(self) -> None:
        """Reset the unpruned weights to their values at setup (or to freshly initialised ones with
        ``resample_parameters``): the "winning ticket" of the lottery ticket hypothesis (arXiv:1803.03635)."""
        assert self._original_layers is not None, "setup() records the original layers"
        for layer in self._original_layers.values():
            source = layer["data"]
            if self._resample_parameters and callable(getattr(source, "reset_parameters", None)):
                source = deepcopy(source)  # the copy taken at setup stays as it was
                source.reset_parameters()
            for index, name in layer["names"]:
                target = self._parameters_to_prune[index][0]
                # a pruned parameter's trainable values live in `<name>_orig`
                dst = getattr(target, name + "_orig", None)
                dst = getattr(target, name) if dst is None else dst
                src = getattr(source, name)
                if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor):
                    dst.data = src.data.to(dst.device)

    def make_pruning_permanent(self, module: nn.Module) -> None:
        """Fold every pruning mask of ``module`` into its parameter and drop torch's reparametrisation."""
        for sub in module.modules():
            for hook in list(sub._forward_pre_hooks.values()):
                if isinstance(hook, torch_prune.BasePruningMethod):
                    torch_prune.remove(sub, hook._tensor_name)

    def _run_pruning(self, epoch: int) -> None:
        amount = _per_epoch(self.amount, epoch)
        if not _per_epoch(self._apply_pruning, epoch) or not amount:
            return
        self.apply_pruning(amount)
        if _per_epoch(self._use_lottery_ticket_hypothesis, epoch):
            self.apply_lottery_ticket_hypothesis()

    # -- sparsity report -----------------------------------------------------------------------
    def _sparsity(self) -> list[tuple[int, int]]:
        """(zeros, size) of each parameter's mask; an unpruned parameter has no zeros yet."""
        stats = []
        for module, name in self._parameters_to_prune:
            mask = getattr(module, name + "_mask", None)
            if mask is None:
                stats.append((0, getattr(module, name).numel()))
            else:
                stats.append((int((mask == 0).sum().item()), mask.numel()))
        return stats

    @rank_zero_only
    def _log_sparsity(self, before: list[tuple[int, int]], after: list[tuple[int, int]], amount: Any) -> None:
        total = sum(size for _, size in after)
        was, now = sum(z for z, _ in before), sum(z for z, _ in after)
        log.info(f"Applied `{self._pruning_method_name}`. Pruned: {was}/{total} ({was / total:.2%}) -> "
                 f"{now}/{total} ({now / total:.2%})")
        if self._verbose == 2:
            for (module, name), (was, size_was), (now, size) in zip(self._parameters_to_prune, before, after):
                log.info(f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. Pruned: "
                         f"{was} ({was / size_was:.2%}) -> {now} ({now / size:.2%})")

    # -- hooks ---------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        pairs = self.sanitize_parameters_to_prune(pl_module, self._parameters_to_prune, self._parameter_names)
        self._parameters_to_prune = self.filter_parameters_to_prune(pairs)
        if self._use_lottery_ticket_hypothesis:
            self._original_layers = {}
            for index, (module, name) in enumerate(self._parameters_to_prune):
                layer = self._original_layers.setdefault(id(module), {"data": deepcopy(module), "names": []})
                layer["names"].append((index, name))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._prune_on_train_epoch_end:
            self._run_pruning(pl_module.current_epoch)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not self._prune_on_train_epoch_end and not trainer.sanity_checking:
            self._run_pruning(pl_module.current_epoch)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._make_pruning_permanent:
            self.make_pruning_permanent(pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        if not self._make_pruning_permanent:
            return
        # the checkpoint gets the pruned weights; the module keeps its masks and goes on training with them
        state = pl_module.state_dict()
        for key in [k[:-len("_mask")] for k in state if k.endswith("_mask")]:
            orig, mask = state.pop(key + "_orig"), state.pop(key + "_mask")
            state[key] = orig * mask.to(dtype=orig.dtype)
        checkpoint["state_dict"] = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


__all__ = ["ModelPruning"]
