"""``CometLogger``: metrics, hyperparameters and the model graph to Comet (Lightning's ``loggers.comet``).

Needs ``pip install comet-ml``. The experiment is ``comet_ml.start(...)`` with the logger's arguments,
started in the constructor on global rank 0 (on other ranks at first use of ``experiment``); other
keyword arguments (``name``, ``log_code``, ``offline_directory``, ...) go to ``comet_ml.ExperimentConfig``.
``online=False`` keeps the experiment on disk (``offline_directory``) to upload later. The run is
flushed, not ended, when the Trainer finishes, so it can be logged to afterwards.
"""

from __future__ import annotations

import os
from argparse import Namespace
from typing import Any, Literal, Mapping

import torch

from gpulayer.trainer.loggers.logger import Logger, rank_zero_experiment
from gpulayer.trainer.loggers.params import convert_params
from gpulayer.trainer.loggers.requirement import Requirement
from gpulayer.trainer.utilities.rank_zero import _rank, log, rank_zero_only

_COMET_AVAILABLE = Requirement("comet-ml>=3.44.4", module="comet_ml")

FRAMEWORK_NAME = "pytorch-lightning"  # how Comet's integrations name this framework in its UI

# older argument names and the ones that replace them
_RENAMED = {"experiment_name": "name", "project_name": "project", "save_dir": "offline_directory"}


class CometLogger(Logger):
    """Log to `Comet <https://www.comet.com>`_ (Lightning's ``CometLogger``)::

        logger = CometLogger(project="mnist", name="baseline")              # online: an API key from `comet login`
        logger = CometLogger(project="mnist", online=False, offline_directory="comet")   # on disk
        logger.experiment.log_image(img, file_name="x.png")                 # Comet's own Experiment

    ``experiment_key`` appends to an existing experiment (or fixes a new one's key); ``mode`` is
    Comet's ``"get_or_create"``, ``"get"`` or ``"create"``; ``prefix`` goes before metric names.
    The older names ``experiment_name``, ``project_name``, ``save_dir`` and ``offline`` still work.
    """

    def __init__(self, *, api_key: str | None = None, workspace: str | None = None, project: str | None = None,
                 experiment_key: str | None = None, mode: Literal["get_or_create", "get", "create"] | None = None,
                 online: bool | None = None, prefix: str | None = None, **kwargs: Any) -> None:
        if not _COMET_AVAILABLE:
            raise ModuleNotFoundError(str(_COMET_AVAILABLE))
        project, online = self._take_old_names(kwargs, project, online)
        self._api_key = api_key
        self._workspace = workspace
        self._project_name = project
        self._experiment_key = experiment_key
        self._mode = mode
        self._online = online
        self._prefix = prefix
        self._kwargs = kwargs
        self._experiment: Any = None
        # comet_ml patches the ML libraries it finds when imported; the logger does the logging, so that is off
        os.environ["COMET_DISABLE_AUTO_LOGGING"] = "1"
        import comet_ml
        self._comet_config = comet_ml.ExperimentConfig(**kwargs)
        if _rank() == 0:  # other ranks of a multi-process run start none (and only use a DummyExperiment)
            self._create_experiment()

    @staticmethod
    def _take_old_names(kwargs: dict[str, Any], project: str | None, online: bool | None) -> tuple[str | None, bool | None]:
        """Move the older argument names in ``kwargs`` to their new ones (a warning each); the new name wins."""
        for old, new in _RENAMED.items():
            if old not in kwargs:
                continue
            value = kwargs.pop(old)
            log.warning(f"The parameter `{old}` is deprecated, please use `{new}` instead.")
            if new == "project":
                if project is None:
                    project = value
                else:
                    log.warning("You specified both `project_name` and `project` parameters, please use `project` only")
            elif new in kwargs:
                log.warning(f"You specified both `{old}` and `{new}` parameters, please use `{new}` only")
            else:
                kwargs[new] = value
        if "offline" in kwargs:
            offline = kwargs.pop("offline")
            log.warning("The parameter `offline` is deprecated, please use `online` instead.")
            if online is None:
                online = not offline
            else:
                log.warning("You specified both `offline` and `online` parameters, please use `online` only")
        return project, online

    def _create_experiment(self) -> None:
        import comet_ml
        self._experiment = comet_ml.start(api_key=self._api_key, workspace=self._workspace, project=self._project_name,
                                          experiment_key=self._experiment_key, mode=self._mode, online=self._online,
                                          experiment_config=self._comet_config)
        if self._experiment is None:
            raise comet_ml.exceptions.ExperimentNotFound("Failed to create Comet experiment.")
        self._experiment_key = self._experiment.get_key()
        self._project_name = self._experiment.project_name
        self._experiment.log_other("Created from", FRAMEWORK_NAME)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """Comet's ``Experiment``: ``self.logger.experiment.log_text(...)`` from a module."""
        if not self._experiment:  # a copy pickled into a spawned rank starts (or rejoins, by key) its own
            self._create_experiment()
        return self._experiment

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # a copy in another process rejoins the same experiment by its key; the live object holds connections
        state["_experiment_key"] = self._experiment.get_key() if self._experiment is not None else None
        state["_experiment"] = None
        return state

    # -- what the Trainer calls ---------------------------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        self.experiment.__internal_api__log_parameters__(parameters=convert_params(params), framework=FRAMEWORK_NAME,
                                                         flatten_nested=True, source="manual")

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        # Comet takes tensors detached and on the CPU; the caller's dict is left as it was
        values = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        epoch = values.pop("epoch", None)  # Comet keeps the epoch as an axis of its own, not as a metric
        self.experiment.__internal_api__log_metrics__(values, step=step, epoch=epoch, prefix=self._prefix,
                                                      framework=FRAMEWORK_NAME)

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        if self._experiment is not None:
            self._experiment.__internal_api__set_model_graph__(graph=model, framework=FRAMEWORK_NAME)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Upload what is buffered; the experiment stays open (``experiment.end()`` closes it)."""
        if self._experiment is not None:  # none in a caller whose ranks ran in other processes
            self.experiment.flush()

    # -- names --------------------------------------------------------------------------------------------------
    @property
    def save_dir(self) -> str | None:
        """Where an offline experiment is written (``offline_directory``)."""
        return self._comet_config.offline_directory

    @property
    def name(self) -> str | None:
        """The project name."""
        return self._project_name

    @property
    def version(self) -> str | None:
        """The experiment's key, once it exists (asking does not start one)."""
        return self._experiment.get_key() if self._experiment is not None else None

