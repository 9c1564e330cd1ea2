"""``WeightAveraging`` and ``EMAWeightAveraging``: keep an average of the weights while training (Lightning 2.6).

The average is torch's ``AveragedModel`` (``torch.optim.swa_utils``) of the module, made when a fit sets up and
updated after the optimizer steps (and epochs) ``should_update`` picks: by default every step, with an equal
weight for each (SWA); ``avg_fn=get_ema_avg_fn(decay)`` or ``EMAWeightAveraging`` make it an exponential moving
average. Buffers are averaged too unless ``use_buffers=False``.

Validation sees the averaged weights (they are swapped in for the validation epoch and back after it), the module
ends the fit holding them, and a checkpoint saved during the fit stores them as its ``state_dict``, with the
weights being trained under ``current_model_state``: a checkpoint loads as the averaged model for inference, and
a resumed fit goes on from the trained weights with its average restored.

>>> trainer = Trainer(callbacks=EMAWeightAveraging(decay=0.999, update_starting_at_step=100))   # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from copy import deepcopy
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from gpulayer.trainer.callbacks.callback import Callback
from gpulayer.trainer.utilities.model_helpers import is_overridden
from gpulayer.trainer.utilities.rank_zero import rank_zero_info, rank_zero_warn

_AVERAGE_PREFIX = "module."  # AveragedModel keeps the copy as `.module`; its own state is `n_averaged`


class WeightAveraging(Callback):
    """Average the weights with ``AveragedModel``; ``kwargs`` (``avg_fn``, ``multi_avg_fn``) go to it.

    ``device``: where the average lives (default: the module's device; ``"cpu"`` saves accelerator memory).
    Override ``should_update(step_idx=None, epoch_idx=None)`` to choose when it is updated.
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True,
                 **kwargs: Any) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._latest_update_step = 0  # the global step of the last update (one update per optimizer step)
        self._latest_update_epoch = -1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average after optimizer step ``step_idx`` (0-based) or after epoch ``epoch_idx``
        (one of the two is given). Default: after every step, never at an epoch's end."""
        return step_idx is not None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        if is_overridden("configure_model", pl_module):
            rank_zero_warn("You're using the WeightAveraging callback with a model that overrides the configure_model "
                           "callback. WeightAveraging doesn't support sharding model layers, so you may run out of "
                           "memory.")
            pl_module.configure_model()  # the average must hold the layers configure_model creates
        self._average_model = AveragedModel(model=pl_module, device=self._device or pl_module.device,
                                            use_buffers=self._use_buffers, **self._kwargs)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # called after every batch; an accumulating batch has not stepped (global_step unchanged)
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=trainer.global_step - 1):
            self._average_model.update_parameters(pl_module)
            self._latest_update_step = trainer.global_step

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._average_model.update_parameters(pl_module)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer, pl_module) -> None:
        self._copy_average_to_current(pl_module)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict["latest_update_step"]

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        if self._average_model is None:
            rank_zero_info("You're using the WeightAveraging callback, but saving a checkpoint outside the 'fit' stage. "
                           "The state of the WeightAveraging callback won't be saved in the checkpoint. If training "
                           "has finished, the average model parameters will be saved to the state_dict in the "
                           "checkpoint.")
            return
        state = self._average_model.state_dict()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k[len(_AVERAGE_PREFIX):]: v for k, v in state.items()
                                    if k.startswith(_AVERAGE_PREFIX)}
        checkpoint["averaging_state"] = {k: v for k, v in state.items() if not k.startswith(_AVERAGE_PREFIX)}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        if self._average_model is None:
            rank_zero_warn("You're using the WeightAveraging callback, but loading a checkpoint outside the 'fit' "
                           "stage. The WeightAveraging state cannot be restored. If you're using the checkpoint for "
                           "prediction or testing, you can ignore this warning. To disable the warning, remove the "
                           "WeightAveraging callback.")
        elif "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            rank_zero_info("Found current_model_state in the checkpoint. This will be used to initialize the model.")
            state = {_AVERAGE_PREFIX + k: v for k, v in checkpoint["state_dict"].items()}
            self._average_model.load_state_dict({**state, **checkpoint["averaging_state"]})
            pl_module.load_state_dict(checkpoint["current_model_state"])  # the module was given the average
        else:
            rank_zero_warn("The checkpoint was not created with WeightAveraging. Both the current and the average "
                           "model will be initialized with state_dict.")
            self._average_model.module.load_state_dict(deepcopy(checkpoint["state_dict"]), strict=False)

    def _pairs(self, pl_module) -> Any:
        """(average, current) tensors: parameters, then buffers, in module order."""
        average = self._average_model.module
        return zip(itertools.chain(average.parameters(), average.buffers()),
                   itertools.chain(pl_module.parameters(), pl_module.buffers()))

    def _swap_models(self, pl_module) -> None:
        """Exchange the values of the module's weights and the average's."""
        for average, current in self._pairs(pl_module):
            held = average.detach().clone()
            average.detach().copy_(current.detach())
            current.detach().copy_(held)

    def _copy_average_to_current(self, pl_module) -> None:
        """Give the module the averaged values."""
        for average, current in self._pairs(pl_module):
            current.detach().copy_(average.detach())


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights: ``average = decay * average + (1 - decay) * current``.

    Updated after every ``update_every_n_steps``-th optimizer step from ``update_starting_at_step`` on, and after
    every epoch from ``update_starting_at_epoch`` on (when given).
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True,
                 decay: float = 0.999, update_every_n_steps: int = 1, update_starting_at_step: int | None = None,
                 update_starting_at_epoch: int | None = None, **kwargs: Any) -> None:
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        return (epoch_idx is not None and self.update_starting_at_epoch is not None
                and epoch_idx >= self.update_starting_at_epoch)


__all__ = ["EMAWeightAveraging", "WeightAveraging"]
