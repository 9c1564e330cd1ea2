"""Lightning's ``loops.optimization.manual`` path: what a manual-optimization ``training_step`` returned.

Under manual optimization the step does its own backward and optimizer steps; what it returns is only passed on
(``on_train_batch_end``'s ``outputs``): a tensor (the loss), a dict, or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gpulayer.trainer.errors import MisconfigurationException


@dataclass
class ManualResult:
    """``extra``: what the step returned, as a dict (a tensor is ``{"loss": tensor}``), its loss detached."""

    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_training_step_output(cls, training_step_output: Any) -> "ManualResult":
        if isinstance(training_step_output, Mapping):
            extra = dict(training_step_output)
        elif isinstance(training_step_output, torch.Tensor):
            extra = {"loss": training_step_output}
        elif training_step_output is None:
            extra = {}
        else:
            raise MisconfigurationException(
                "In manual optimization, `training_step` must either return a Tensor or have no return.")
        if isinstance(extra.get("loss"), torch.Tensor):
            extra["loss"] = extra["loss"].detach()  # the step did its backward already
        return cls(extra=extra)

    def asdict(self) -> dict[str, Any]:
        return self.extra


__all__ = ["ManualResult"]
