"""``MLFlowLogger``: metrics, parameters and checkpoints to an MLflow tracking store (Lightning's ``loggers.mlflow``).

Needs ``pip install mlflow`` (or ``mlflow-skinny``). The ``experiment`` is an ``MlflowClient`` on the
tracking URI; at first use it finds or creates the MLflow experiment by name and starts a run in
it (or takes the run ``run_id`` names). Without a tracking server the store is the local directory
``save_dir`` (``file:./mlruns``), which ``mlflow ui`` reads. The logger's ``name`` is the experiment's
id and its ``version`` the run's id, so checkpoints go to ``save_dir/<experiment id>/<run id>/checkpoints``.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from argparse import Namespace
from typing import Any, Callable, Literal, Mapping

from gpulayer.trainer.loggers.checkpoint_uploads import (CHECKPOINT_SETTINGS, aliases_for, checkpoint_metadata,
                                                         new_checkpoints, upload_now)
from gpulayer.trainer.loggers.logger import Logger, rank_zero_experiment
from gpulayer.trainer.loggers.params import add_prefix, convert_params, flatten_dict
from gpulayer.trainer.loggers.requirement import Requirement
from gpulayer.trainer.utilities.rank_zero import rank_zero_only, rank_zero_warn

log = logging.getLogger(__name__)

_MLFLOW_AVAILABLE = Requirement("mlflow>=1.0.0")
_MLFLOW_SYNCHRONOUS_AVAILABLE = Requirement("mlflow>=2.8.0")  # log_batch(synchronous=...)

LOCAL_FILE_URI_PREFIX = "file:"
_PARAM_VALUE_LIMIT = 250  # characters MLflow keeps of a parameter's value (older servers: 250, newer: 500)
_BATCH_LIMIT = 100  # parameters MLflow takes in one log_batch
_RUN_STATUS = {"success": "FINISHED", "failed": "FAILED", "finished": "FINISHED"}
_METRIC_NAME_REFUSED = re.compile(r"[^a-zA-Z0-9_/. -]+")  # what MLflow does not accept in a metric's name


class MLFlowLogger(Logger):
    """Log to `MLflow <https://mlflow.org>`_ (Lightning's ``MLFlowLogger``)::

        logger = MLFlowLogger(experiment_name="lightning_logs", tracking_uri="file:./ml-runs")
        Trainer(logger=logger).fit(model)
        logger.experiment.log_text(logger.run_id, "notes", "notes.txt")   # the MlflowClient itself

    ``tracking_uri`` defaults to ``$MLFLOW_TRACKING_URI``, else ``file:<save_dir>``; ``run_name`` becomes
    the run's ``mlflow.runName`` tag (over one in ``tags``); ``run_id`` resumes an existing run.
    ``log_model``: ``"all"`` uploads each checkpoint as it is saved, ``True`` at the end of training,
    ``False`` none; each goes as an artifact directory named after the file, with its metadata.
    ``synchronous`` (mlflow >= 2.8) says whether each logging call waits for the store.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, experiment_name: str = "lightning_logs", run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict[str, Any] | None = None,
                 save_dir: str | None = "./mlruns", log_model: Literal[True, False, "all"] = False, prefix: str = "",
                 artifact_location: str | None = None, run_id: str | None = None,
                 synchronous: bool | None = None) -> None:
        if not _MLFLOW_AVAILABLE:
            raise ModuleNotFoundError(str(_MLFLOW_AVAILABLE))
        if synchronous is not None and not _MLFLOW_SYNCHRONOUS_AVAILABLE:
            raise ModuleNotFoundError("`synchronous` requires mlflow>=2.8.0")
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"{LOCAL_FILE_URI_PREFIX}{save_dir}"
        self._experiment_name = experiment_name
        self._experiment_id: str | None = None
        self._tracking_uri = tracking_uri
        self._run_name = run_name
        self._run_id = run_id
        self.tags = tags
        self._log_model = log_model
        self._logged_model_time: dict[str, float] = {}  # path -> mtime when uploaded
        self._checkpoint_callback: Any = None  # the callback whose files go up at the end (log_model=True)
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._log_batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self._initialized = False  # the experiment and run are known (found, created or given)
        from mlflow.tracking import MlflowClient
        self._mlflow_client = MlflowClient(tracking_uri)

    # -- the run ------------------------------------------------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``MlflowClient``, with this logger's experiment and run set up at first use."""
        if self._initialized:
            return self._mlflow_client
        import mlflow
        mlflow.set_tracking_uri(self._tracking_uri)  # so mlflow's own calls (mlflow.log_artifact) reach the same store
        if self._run_id is not None:
            self._experiment_id = self._mlflow_client.get_run(self._run_id).info.experiment_id
            self._initialized = True
            return self._mlflow_client
        if self._experiment_id is None:
            self._experiment_id = self._find_or_create_experiment()
        self._run_id = self._mlflow_client.create_run(experiment_id=self._experiment_id,
                                                      tags=_get_resolve_tags()(self._run_tags())).info.run_id
        self._initialized = True
        return self._mlflow_client

    def _find_or_create_experiment(self) -> str:
        found = self._mlflow_client.get_experiment_by_name(self._experiment_name)
        if found is not None and found.lifecycle_stage != "deleted":
            return found.experiment_id
        log.warning(f"Experiment with name {self._experiment_name} not found. Creating it.")
        return self._mlflow_client.create_experiment(name=self._experiment_name,
                                                     artifact_location=self._artifact_location)

    def _run_tags(self) -> dict[str, Any] | None:
        if self._run_name is None:
            return self.tags
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME
        self.tags = self.tags or {}
        if MLFLOW_RUN_NAME in self.tags:
            log.warning(f"The tag {MLFLOW_RUN_NAME} is found in tags. The value will be overridden by {self._run_name}.")
        self.tags[MLFLOW_RUN_NAME] = self._run_name
        return self.tags

    @property
    def run_id(self) -> str | None:
        """The run's id (sets the run up when it is not yet)."""
        _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The MLflow experiment's id (sets the run up when it is not yet)."""
        _ = self.experiment
        return self._experiment_id

    # -- what the Trainer calls ---------------------------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        from mlflow.entities import Param
        flat = flatten_dict(convert_params(params))
        entries = [Param(key=k, value=str(v)[:_PARAM_VALUE_LIMIT]) for k, v in flat.items()]
        for start in range(0, len(entries), _BATCH_LIMIT):
            self.experiment.log_batch(run_id=self.run_id, params=entries[start:start + _BATCH_LIMIT],
                                      **self._log_batch_kwargs)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric
        timestamp_ms = int(time.time() * 1000)
        entries = []
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, str):
                log.warning(f"Discarding metric with string value {key}={value}.")
                continue
            allowed = _METRIC_NAME_REFUSED.sub("", key)
            if allowed != key:
                rank_zero_warn("MLFlow only allows '_', '/', '.' and ' ' special characters in metric name. "
                               f"Replacing {key} with {allowed}.", category=RuntimeWarning)
            entries.append(Metric(key=allowed, value=value, timestamp=timestamp_ms, step=step or 0))
        self.experiment.log_batch(run_id=self.run_id, metrics=entries, **self._log_batch_kwargs)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if upload_now(self._log_model, checkpoint_callback):
            self._upload_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callback = checkpoint_callback

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """Upload the checkpoints kept for the end and mark the run ``FINISHED`` or ``FAILED``."""
        if not self._initialized:
            return  # no run here (a caller whose ranks ran in other processes): nothing to end
        if self._checkpoint_callback:
            self._upload_checkpoints(self._checkpoint_callback)
        if self.experiment.get_run(self.run_id):
            self.experiment.set_terminated(self.run_id, _RUN_STATUS.get(status, status))

    def _upload_checkpoints(self, checkpoint_callback: Any) -> None:
        import yaml
        for mtime, path, score, _tag in new_checkpoints(checkpoint_callback, self._logged_model_time):
            metadata = checkpoint_metadata(checkpoint_callback, path, score,
                                           settings=(*CHECKPOINT_SETTINGS, "_every_n_val_epochs"), group="Checkpoint")
            artifact_path = os.path.splitext(os.path.basename(path))[0]
            self.experiment.log_artifact(self._run_id, path, artifact_path)
            with tempfile.TemporaryDirectory() as tmp:  # its metadata and aliases beside it, in the same directory
                with open(os.path.join(tmp, "metadata.yaml"), "w") as f:
                    yaml.dump(metadata, f, default_flow_style=False)
                with open(os.path.join(tmp, "aliases.txt"), "w") as f:
                    f.write(str(aliases_for(checkpoint_callback, path)))
                self.experiment.log_artifacts(self._run_id, tmp, artifact_path)
            self._logged_model_time[path] = mtime

    # -- names --------------------------------------------------------------------------------------------------
    @property
    def save_dir(self) -> str | None:
        """The local directory of a ``file:`` tracking URI; None for a tracking server."""
        if self._tracking_uri.startswith(LOCAL_FILE_URI_PREFIX):
            return self._tracking_uri[len(LOCAL_FILE_URI_PREFIX):]
        return None

    @property
    def name(self) -> str | None:
        """The MLflow experiment's id."""
        return self.experiment_id

    @property
    def version(self) -> str | None:
        """The run's id."""
        return self.run_id



def _get_resolve_tags() -> Callable[[dict[str, Any] | None], dict[str, Any]]:
    """MLflow's function that adds its context tags (user, source, git commit) to a run's, where it has one."""
    from mlflow.tracking import context
    if hasattr(context, "resolve_tags"):  # mlflow < 1.1
        return context.resolve_tags
    if hasattr(context, "registry"):
        from mlflow.tracking.context.registry import resolve_tags
        return resolve_tags
    return lambda tags: tags
