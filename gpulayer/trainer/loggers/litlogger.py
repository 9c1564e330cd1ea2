"""``LitLogger``: experiment tracking, files and models on lightning.ai (Lightning's ``loggers.litlogger``).

Needs ``pip install litlogger``. The ``experiment`` is a ``litlogger.Experiment`` named
``<name>-<version>``, where the version is the time it was created (an RFC 3339 UTC timestamp with
``-`` for ``:``, so it can name files), created at first use on global rank 0 with its local files
in ``root_dir/name``. Each metric is a series the experiment holds (``experiment[key].append(value,
step=...)``); hyperparameters and metadata are its string-valued keys; files and models are
assigned to keys (``experiment[key] = litlogger.File(path)``).
"""

from __future__ import annotations

import os
import warnings
from argparse import Namespace
from datetime import datetime, timezone
from typing import Any, Mapping

import torch

from gpulayer.trainer.loggers.checkpoint_uploads import new_checkpoints, upload_now
from gpulayer.trainer.loggers.files import filesystem
from gpulayer.trainer.loggers.logger import Logger, rank_zero_experiment
from gpulayer.trainer.loggers.params import add_prefix
from gpulayer.trainer.loggers.requirement import Requirement
from gpulayer.trainer.utilities.rank_zero import rank_zero_only

_LITLOGGER_AVAILABLE = Requirement("litlogger>=0.1.0")


def _create_experiment_name() -> str:
    """A random readable name from litlogger's own generator."""
    from litlogger.generator import _create_name
    return _create_name()


class LitLogger(Logger):
    """Track an experiment on `lightning.ai <https://lightning.ai>`_ (Lightning's ``LitLogger``)::

        logger = LitLogger("./lightning_logs", name="boring_model", teamspace="my-team", log_model=True)
        Trainer(logger=logger).fit(model)
        logger.log_file("config.yaml"); logger.log_model(model)

    ``name`` defaults to a generated one; ``metadata`` are tags of the experiment (as strings);
    ``log_model=True`` uploads ``ModelCheckpoint``'s files as models when training ends (as they are
    saved with ``save_top_k=-1``), under ``checkpoint_name`` or the experiment's name; ``save_logs``
    captures and uploads the terminal's output.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, root_dir: str | os.PathLike | None = None, name: str | None = None, teamspace: str | None = None,
                 metadata: dict[str, str] | None = None, store_step: bool = True, log_model: bool = False,
                 save_logs: bool = True, checkpoint_name: str | None = None) -> None:
        if not _LITLOGGER_AVAILABLE:
            raise ModuleNotFoundError(str(_LITLOGGER_AVAILABLE))
        self._root_dir = os.fspath(root_dir or "./lightning_logs")
        self._name = name or _create_experiment_name()
        self._version: str | None = None  # the experiment's creation time, set when it is created
        self._teamspace = teamspace
        self._metadata = metadata or {}
        self._store_step = store_step
        self._log_model = log_model
        self._save_logs = save_logs
        self._checkpoint_name = checkpoint_name
        self._sub_dir: str | None = None
        self._prefix = ""
        self._step = -1  # the last step logged: a model uploaded without a version takes it
        self._experiment: Any = None
        self._checkpoint_callback: Any = None  # the callback whose files go up at the end
        self._logged_model_time: dict[str, float] = {}  # path -> mtime when uploaded

    # -- names --------------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> str | None:
        """When the experiment was created (None until it is)."""
        return self._version

    @property
    def root_dir(self) -> str:
        return self._root_dir

    @property
    def sub_dir(self) -> str | None:
        return self._sub_dir

    @property
    def log_dir(self) -> str:
        """``root_dir/name[/sub_dir]``, with ``~`` and environment variables expanded: the experiment's local files."""
        path = os.path.join(self.root_dir, self.name)
        if isinstance(self.sub_dir, str):
            path = os.path.join(path, self.sub_dir)
        return os.path.expanduser(os.path.expandvars(path))

    @property
    def save_dir(self) -> str:
        return self.log_dir

    @property
    def _experiment_name(self) -> str:
        return self.name if self.version is None else f"{self.name}-{self.version}"

    # -- the experiment -----------------------------------------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``litlogger.Experiment`` (created at first use, its link printed)."""
        if self._experiment is not None:
            return self._experiment
        import litlogger
        if self.root_dir:
            filesystem(self.root_dir).makedirs(self.root_dir, exist_ok=True)
        if self._version is None:
            created = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            self._version = created.replace("+00:00", "Z").replace(":", "-")
        self._experiment = litlogger.Experiment(
            name=self._experiment_name, teamspace=self._teamspace,
            metadata={k: str(v) for k, v in self._metadata.items()},
            store_step=self._store_step, store_created_at=True, log_dir=self.log_dir, save_logs=self._save_logs)
        self._experiment.print_url()
        return self._experiment

    @property
    @rank_zero_only
    def url(self) -> str:
        """The experiment's page on lightning.ai."""
        return self.experiment.url

    # -- what the Trainer calls ---------------------------------------------------------------------------------
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        experiment = self.experiment
        self._step = self._step + 1 if step is None else step
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            experiment[key].append(value.item() if isinstance(value, torch.Tensor) else value, step=self._step)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: dict[str, Any] | None = None) -> None:
        """Each hyperparameter as a key of the experiment, its value as a string."""
        self.log_metadata(params)

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        warnings.warn("LitLogger does not support `log_graph`", UserWarning, stacklevel=2)

    @rank_zero_only
    def save(self) -> None:
        pass  # the experiment uploads as it goes

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if not self._log_model:
            return
        if upload_now(self._log_model, checkpoint_callback):
            self._upload_checkpoints(checkpoint_callback)
        else:
            self._checkpoint_callback = checkpoint_callback

    @rank_zero_only
    def finalize(self, status: str | None = None) -> None:
        """Upload the checkpoints kept for the end, then end the experiment with ``status``."""
        if self._experiment is None:
            return  # never created (nothing was logged here)
        if self._checkpoint_callback:
            self._upload_checkpoints(self._checkpoint_callback)
        self._experiment.finalize(status)

    def _upload_checkpoints(self, checkpoint_callback: Any) -> None:
        from litlogger import Model
        for mtime, path, _score, _tag in new_checkpoints(checkpoint_callback, self._logged_model_time):
            experiment = self.experiment
            step = getattr(checkpoint_callback, "_last_global_step_saved", None)
            experiment[self._checkpoint_name or experiment.name] = Model(path, version=_model_version(None, step))
            self._logged_model_time[path] = mtime

    # -- files, models, metadata --------------------------------------------------------------------------------
    @rank_zero_only
    def log_metadata(self, params: dict[str, Any] | Namespace) -> None:
        """Each entry as a key of the experiment, its value as a string."""
        if isinstance(params, Namespace):
            params = vars(params)
        experiment = self.experiment
        for key, value in params.items():
            experiment[key] = str(value)

    @rank_zero_only
    def log_model(self, model: Any, staging_dir: str | None = None, verbose: bool = False, version: str | None = None,
                  metadata: dict[str, Any] | None = None) -> None:
        """Save ``model`` (an ``nn.Module`` or any object litlogger can save) and upload it; ``version`` defaults to
        the last step logged."""
        from litlogger import Model
        self.experiment[self._experiment_name] = Model(model, version=_model_version(version, self._step),
                                                       metadata=metadata, staging_dir=staging_dir)

    @rank_zero_only
    def log_model_artifact(self, path: str, verbose: bool = False, version: str | None = None) -> None:
        """Upload a model file or directory; ``version`` defaults to the last step logged."""
        from litlogger import Model
        self.experiment[self._experiment_name] = Model(path, version=_model_version(version, self._step))

    @rank_zero_only
    def log_file(self, path: str) -> None:
        """Upload a file, under its path relative to the working directory (its name when outside it)."""
        from litlogger import File
        self.experiment[_artifact_key(path)] = File(path)

    @rank_zero_only
    def get_file(self, path: str, verbose: bool = True) -> str:
        """Download the file ``log_file(path)`` uploaded to ``path``; returns where it was saved."""
        return self.experiment[_artifact_key(path)].save(path)


def _artifact_key(path: str) -> str:
    """The key a file goes under: its path relative to the working directory, or its name when outside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        relative = None
    key = relative if relative is not None and not relative.startswith("..") else os.path.basename(path)
    return key.replace("\\", "/")


def _model_version(version: str | None, step: int | None) -> str | None:
    """The version given, else the step (when one was logged)."""
    if version is not None:
        return version
    return str(step) if step is not None and step >= 0 else None
