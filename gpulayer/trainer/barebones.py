"""``Trainer(barebones=True)``: every feature that costs speed is off, to measure the Trainer's own overhead.

Lightning's documented switch: no checkpointing, logger, progress bar, model summary,
step logging (``self.log`` warns and records nothing), sanity check; and the debugging
aids (``fast_dev_run``, ``detect_anomaly``, ``profiler``) refused. An argument that asks
for one of them is an error rather than silently overridden.
"""

from __future__ import annotations

import os
from typing import Any

from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.utilities.rank_zero import rank_zero_info

# argument -> (the value barebones sets, why the feature is off)
_TURNED_OFF = {
    "enable_checkpointing": (False, "Checkpointing can impact raw speed so it is disabled in barebones mode."),
    "logger": (False, "Logging can impact raw speed so it is disabled in barebones mode."),
    "enable_progress_bar": (False, "The progress bar can impact raw speed so it is disabled in barebones mode."),
    "log_every_n_steps": (0, "Logging can impact raw speed so it is disabled in barebones mode."),
    "enable_model_summary": (False, "Model summary can impact raw speed so it is disabled in barebones mode."),
    "num_sanity_val_steps": (0, "Sanity checking can impact raw speed so it is disabled in barebones mode."),
}
_REFUSED = {
    "fast_dev_run": "Development run is not meant for raw speed evaluation so it is disabled in barebones mode.",
    "detect_anomaly": "Anomaly detection can impact raw speed so it is disabled in barebones mode.",
    "profiler": "Profiling can impact raw speed so it is disabled in barebones mode.",
}

DEACTIVATED = (
    " - Checkpointing: `Trainer(enable_checkpointing=True)`",
    " - Progress bar: `Trainer(enable_progress_bar=True)`",
    " - Model summary: `Trainer(enable_model_summary=True)`",
    " - Logging: `Trainer(logger=True)`, `Trainer(log_every_n_steps>0)`, `LightningModule.log(...)`,"
    " `LightningModule.log_dict(...)`",
    " - Sanity checking: `Trainer(num_sanity_val_steps>0)`",
    " - Development run: `Trainer(fast_dev_run=True)`",
    " - Anomaly detection: `Trainer(detect_anomaly=True)`",
    " - Profiling: `Trainer(profiler=...)`",
)


def _refuse(name: str, value: Any, why: str) -> TrainerConfigError:
    return TrainerConfigError(f"`Trainer(barebones=True, {name}={value!r})` was passed. {why}")


def _asks_for(value: Any) -> bool:
    """An argument that turns its feature on (None, False and 0 leave it off)."""
    return value is not None and value is not False and not (isinstance(value, int) and value == 0)


def apply(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Trainer arguments with barebones' settings; an argument that turns a feature back on is an error."""
    out = dict(kwargs)
    for name, (off, why) in _TURNED_OFF.items():
        if _asks_for(kwargs.get(name)):
            raise _refuse(name, kwargs[name], why)
        out[name] = off
    for name, why in _REFUSED.items():
        if _asks_for(kwargs.get(name)):
            raise _refuse(name, kwargs[name], why)
    rank_zero_info("You are running in `Trainer(barebones=True)` mode. All features that may impact raw speed have "
                   "been disabled to facilitate analyzing the Trainer overhead. Specifically, the following features "
                   f"are deactivated:{os.linesep}{os.linesep.join(DEACTIVATED)}")
    return out
