"""The Trainer's errors: each message says what was asked, what was found and what to do."""

from __future__ import annotations

from gpulayer.errors import GpulayerError


class TrainerError(GpulayerError):
    """The Trainer cannot do what it was asked; the message names the fix."""


class MisconfigurationException(TrainerError):
    """Lightning's name for a wrong setting (``lightning.pytorch.utilities.exceptions``); Lightning users catch it."""


class TrainerConfigError(MisconfigurationException, ValueError):
    """A Trainer argument or a module hook returned a value the Trainer does not accept."""


class TrainerTypeError(TrainerConfigError, TypeError):
    """An argument of the wrong type (a ``TypeError`` in Lightning, so both catch it)."""


class CheckpointNotFound(TrainerError, FileNotFoundError):
    """A ``ckpt_path`` that names no file (a ``FileNotFoundError`` in Lightning, so both catch it)."""


class RankFailed(TrainerError):
    """A rank of a multi-process fit failed; carries the rank and its traceback."""

    def __init__(self, rank: int, detail: str):
        self.rank = rank
        self.detail = detail
        self.attempts: list[dict] = []  # a cluster fit: where each attempt ran and how it ended (see fit_info)
        super().__init__(f"rank {rank} failed:\n{detail}")


class ManualOptimizationRequired(TrainerConfigError, RuntimeError):
    """Several optimizers under automatic optimization (a ``RuntimeError`` in Lightning, so both catch it)."""


class DeviceMeshMismatch(TrainerConfigError, RuntimeError):
    """A model-parallel mesh whose sizes do not multiply to the world size (a ``RuntimeError`` in Lightning)."""


class SIGTERMException(SystemExit):
    """Lightning's: the fit stops after ``received_sigterm`` (on the cluster, once rank 0 saved its checkpoint).

    Exits with 143 (128 + SIGTERM), as a process ended by SIGTERM reports itself in a shell.
    """
