"""``WandbLogger``: metrics, hyperparameters, media and checkpoints to Weights & Biases (Lightning's ``loggers.wandb``).

Needs ``pip install wandb``; ``wandb`` is imported when the run is first used, never at import time.
The run (``experiment``) is ``wandb.init(...)`` with the logger's arguments, created at first use on
global rank 0, or the run already in progress in the process (``wandb.run``, with a warning).
``offline=True`` sets ``WANDB_MODE`` so the run is written under ``save_dir`` and synced later.

Metrics go to ``run.log`` with the Trainer's step as ``trainer/global_step`` (the x-axis the run
declares); hyperparameters to ``run.config``. ``log_model`` uploads ``ModelCheckpoint``'s files as
``model`` artifacts named ``model-<run id>`` with ``latest``/``best`` aliases (checkpoint_uploads.py).
"""

from __future__ import annotations

import contextlib
import os
from argparse import Namespace
from typing import Any, Literal, Mapping

from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.loggers.checkpoint_uploads import aliases_for, checkpoint_metadata, new_checkpoints, upload_now
from gpulayer.trainer.loggers.logger import Logger, rank_zero_experiment
from gpulayer.trainer.loggers.params import add_prefix, convert_params, json_serializable, sanitize_callables
from gpulayer.trainer.loggers.requirement import Requirement
from gpulayer.trainer.utilities.rank_zero import rank_zero_only, rank_zero_warn

_WANDB_AVAILABLE = Requirement("wandb>=0.12.10")

STEP_KEY = "trainer/global_step"  # the Trainer's step, logged with each row and declared as the run's x-axis


class WandbLogger(Logger):
    """Log to `Weights & Biases <https://wandb.ai>`_ (Lightning's ``WandbLogger``)::

        logger = WandbLogger(project="MNIST", log_model="all")
        Trainer(logger=logger).fit(model)
        logger.experiment.config["batch_size"] = 32      # the wandb run itself

    ``name`` is the run's display name, ``version``/``id`` its id (to resume it), ``save_dir``/``dir``
    where wandb writes; ``project`` falls back to ``$WANDB_PROJECT``, then ``"lightning_logs"``, and is
    the logger's ``name``. Other keyword arguments go to ``wandb.init`` (``entity``, ``group``, ``tags``).
    ``log_model``: ``"all"`` uploads each checkpoint as it is saved, ``True`` at the end of training,
    ``False`` none; it needs a connection, so ``offline=True`` refuses it.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, name: str | None = None, save_dir: str | os.PathLike | None = ".", version: str | None = None,
                 offline: bool = False, dir: str | os.PathLike | None = None, id: str | None = None,
                 anonymous: bool | None = None, project: str | None = None, log_model: Literal["all"] | bool = False,
                 experiment: Any = None, prefix: str = "", checkpoint_name: str | None = None,
                 add_file_policy: Literal["mutable", "immutable"] = "mutable", **kwargs: Any) -> None:
        if not _WANDB_AVAILABLE:
            raise ModuleNotFoundError(str(_WANDB_AVAILABLE))
        if offline and log_model:
            raise MisconfigurationException(
                f"Providing log_model={log_model} and offline={offline} is an invalid configuration since model "
                "checkpoints cannot be uploaded in offline mode.\nHint: Set `offline=False` to log your model.")
        self._offline = offline
        self._log_model = log_model
        self._prefix = prefix
        self._experiment = experiment
        self._checkpoint_name = checkpoint_name
        self.add_file_policy = add_file_policy
        self._logged_model_time: dict[str, float] = {}  # path -> mtime when uploaded
        self._checkpoint_callbacks: dict[int, Any] = {}  # the callbacks whose files go up at the end (log_model=True)
        where = save_dir if save_dir is not None else dir
        self._wandb_init: dict[str, Any] = {
            "name": name,
            "project": project or os.environ.get("WANDB_PROJECT", "lightning_logs"),
            "dir": os.fspath(where) if where is not None else None,
            "id": version or id,
            "resume": "allow",
            "anonymous": "allow" if anonymous else None,
            **kwargs,
        }
        self._project = self._wandb_init.get("project")
        self._save_dir = self._wandb_init.get("dir")
        self._name = self._wandb_init.get("name")
        self._id = self._wandb_init.get("id")

    # -- the run ------------------------------------------------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The wandb run: ``self.logger.experiment.log({...})`` from a module."""
        if self._experiment is None:
            import wandb
            if self._offline:
                os.environ["WANDB_MODE"] = "dryrun"  # wandb's offline mode: written locally, `wandb sync` later
            attach_id = getattr(self, "_attach_id", None)
            if wandb.run is not None:
                rank_zero_warn("There is a wandb run already in progress and newly created instances of `WandbLogger` "
                               "will reuse this run. If this is not desired, call `wandb.finish()` before "
                               "instantiating `WandbLogger`.")
                self._experiment = wandb.run
            elif attach_id is not None and hasattr(wandb, "_attach"):
                # a copy pickled into another process joins the run its original started
                self._experiment = wandb._attach(attach_id)
            else:
                self._experiment = wandb.init(**self._wandb_init)
                self._declare_step_axis()
        return self._experiment

    def _declare_step_axis(self) -> None:
        """Charts plot against the Trainer's step (or TensorBoard's ``global_step`` when wandb syncs its files)."""
        run = self._experiment
        if not isinstance(run, _run_types()) or not getattr(run, "define_metric", None):
            return
        if self._wandb_init.get("sync_tensorboard"):
            run.define_metric("*", step_metric="global_step")
        else:
            run.define_metric(STEP_KEY)
            run.define_metric("*", step_metric=STEP_KEY, step_sync=True)

    def __getstate__(self) -> dict[str, Any]:
        # pickled for another process (a spawned rank, the caller of a multi-process stage): the run is started here
        # and the copy attaches to it by id, so every stage of the Trainer logs to one run
        import wandb
        with contextlib.suppress(Exception):  # wandb >= 0.18 always runs its service; older ones need asking
            wandb.require("service")
        _ = self.experiment
        state = self.__dict__.copy()
        if self._experiment is not None:
            state["_id"] = getattr(self._experiment, "id", None)
            state["_attach_id"] = getattr(self._experiment, "_attach_id", None)
            state["_name"] = self._experiment.name
        state["_experiment"] = None  # a live run holds sockets and threads
        return state

    # -- what the Trainer calls ---------------------------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        params = json_serializable(sanitize_callables(convert_params(params)))
        self.experiment.config.update(params, allow_val_change=True)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        metrics = add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        if step is not None and not self._wandb_init.get("sync_tensorboard"):
            self.experiment.log({**metrics, STEP_KEY: step})
        else:  # wandb steps the row itself (or takes TensorBoard's step from the synced files)
            self.experiment.log(dict(metrics))

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if upload_now(self._log_model, checkpoint_callback):
            self._upload_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callbacks[id(checkpoint_callback)] = checkpoint_callback

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if status != "success" or self._experiment is None:
            return  # checkpoints go up only after a successful run
        for checkpoint_callback in self._checkpoint_callbacks.values():
            self._upload_checkpoints(checkpoint_callback)

    def _upload_checkpoints(self, checkpoint_callback: Any) -> None:
        import wandb
        for mtime, path, score, _tag in new_checkpoints(checkpoint_callback, self._logged_model_time):
            if not self._checkpoint_name:
                self._checkpoint_name = f"model-{self.experiment.id}"
            artifact = wandb.Artifact(name=self._checkpoint_name, type="model",
                                      metadata=checkpoint_metadata(checkpoint_callback, path, score))
            artifact.add_file(path, name="model.ckpt", policy=self.add_file_policy)
            self.experiment.log_artifact(artifact, aliases=aliases_for(checkpoint_callback, path))
            self._logged_model_time[path] = mtime

    # -- wandb's own features -----------------------------------------------------------------------------------
    def watch(self, model: Any, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True) -> None:
        """Log the model's gradients (``log="all"``: and parameters) every ``log_freq`` steps, and its graph."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    @rank_zero_only
    def log_table(self, key: str, columns: list[str] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None) -> None:
        """A ``wandb.Table`` from ``columns`` and ``data`` rows, or from a pandas ``dataframe``."""
        import wandb
        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)

    @rank_zero_only
    def log_text(self, key: str, columns: list[str] | None = None, data: list[list[str]] | None = None,
                 dataframe: Any = None, step: int | None = None) -> None:
        """Text as a table (``log_table``)."""
        self.log_table(key, columns, data, dataframe, step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Images (tensors, arrays, PIL images, paths); each keyword is a list with one item per image
        (``caption=[...]``, ``masks=[...]``)."""
        import wandb
        self._log_media(key, "images", images, wandb.Image, step, kwargs)

    @rank_zero_only
    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Audio clips (arrays or paths); keywords as for ``log_image`` (``caption``, ``sample_rate``)."""
        import wandb
        self._log_media(key, "audios", audios, wandb.Audio, step, kwargs)

    @rank_zero_only
    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Videos (arrays or paths); keywords as for ``log_image`` (``caption``, ``fps``, ``format``)."""
        import wandb
        self._log_media(key, "videos", videos, wandb.Video, step, kwargs)

    def _log_media(self, key: str, what: str, items: list[Any], make: Any, step: int | None,
                   per_item: dict[str, list[Any]]) -> None:
        if not isinstance(items, list):
            raise TypeError(f'Expected a list as "{what}", found {type(items)}')
        for name, values in per_item.items():
            if len(values) != len(items):
                raise ValueError(f"Expected {len(items)} items but only found {len(values)} for {name}")
        media = [make(item, **{name: values[i] for name, values in per_item.items()}) for i, item in enumerate(items)]
        self.log_metrics({key: media}, step)

    @staticmethod
    @rank_zero_only
    def download_artifact(artifact: str, save_dir: str | os.PathLike | None = None, artifact_type: str | None = None,
                          use_artifact: bool | None = True) -> str:
        """Download an artifact; from the run in progress (recording that it used it) when there is one and
        ``use_artifact``, else through wandb's public API. Returns the directory it is in."""
        import wandb
        if wandb.run is not None and use_artifact:
            found = wandb.run.use_artifact(artifact)
        else:
            found = wandb.Api().artifact(artifact, type=artifact_type)
        return found.download(root=None if save_dir is None else os.fspath(save_dir))

    def use_artifact(self, artifact: str, artifact_type: str | None = None) -> Any:
        """Record that this run uses ``artifact``; returns the wandb ``Artifact``."""
        return self.experiment.use_artifact(artifact, type=artifact_type)

    # -- names --------------------------------------------------------------------------------------------------
    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def name(self) -> str | None:
        """The project (not the run's display name: that is ``experiment.name``)."""
        return self._project

    @property
    def version(self) -> str | None:
        """The run's id; the one given to the constructor until the run exists (asking does not start it)."""
        return self._experiment.id if self._experiment else self._id


def _run_types() -> tuple[type, ...]:
    """wandb's run classes, where this wandb has them (``RunDisabled`` is gone from newer releases)."""
    found = []
    with contextlib.suppress(ImportError):
        from wandb.wandb_run import Run
        found.append(Run)
    with contextlib.suppress(ImportError):
        from wandb.sdk.lib import RunDisabled
        found.append(RunDisabled)
    return tuple(t for t in found if isinstance(t, type))
