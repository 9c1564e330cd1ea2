"""What the Trainer is doing: ``trainer.state`` with Lightning's enums (``lightning.pytorch.trainer.states``).

``state.fn`` is the entry point that runs (``fit``, ``validate``, ``test``, ``predict``),
``state.stage`` the loop inside it (a fit moves through sanity check, training and
validation), ``state.status`` whether it runs, finished or was interrupted. The enums
are ``str`` values that compare equal to their value in any case, as Lightning's do,
so ``trainer.state.fn == "fit"`` holds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum


class _CaseInsensitiveStr(str, Enum):
    """A ``str`` enum member equals its value, whatever the case."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Enum):
            other = other.value
        return isinstance(other, str) and self.value.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.value.lower())

    def __str__(self) -> str:
        return self.value

    @classmethod
    def from_str(cls, value: str):
        """The member whose value or name is ``value`` (any case)."""
        for member in cls:
            if value.lower() in (member.value.lower(), member.name.lower()):
                return member
        raise ValueError(f"{value!r} is not a {cls.__name__}; one of {[m.value for m in cls]}")


class TrainerStatus(_CaseInsensitiveStr):
    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(_CaseInsensitiveStr):
    """The Trainer method that runs."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(_CaseInsensitiveStr):
    """The loop that runs inside a ``TrainerFn`` (a fit: sanity check, training, validation)."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str:
        """The stem of the loader hook this stage reads (``val`` for validation and the sanity check)."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


@dataclass
class TrainerState:
    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        return self.status.stopped


# Lightning users import these from ``<package>.trainer.states``; here ``trainer`` is a module, not a
# package, so the name is registered for the import system to find
sys.modules.setdefault("gpulayer.trainer.trainer.states", sys.modules[__name__])
