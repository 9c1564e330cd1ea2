"""``TensorBoardLogger``: event files and ``hparams.yaml`` in ``save_dir/name/version_N[/sub_dir]`` (Lightning's
``loggers.tensorboard``); needs ``pip install tensorboard``.

The writer is torch's ``SummaryWriter``, created at first use on global rank 0. Hyperparameters go
to TensorBoard's HParams tab (flattened to ``a/b`` keys, with the ``hp_metric`` placeholder unless
``default_hp_metric=False``) and, when the run ends, to ``hparams.yaml`` (written once).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any, Mapping

import torch

from gpulayer.trainer.loggers.files import filesystem
from gpulayer.trainer.loggers.logger import FileLogger, rank_zero_experiment
from gpulayer.trainer.loggers.params import add_prefix, convert_params, flatten_dict, sanitize_params

# whether TensorBoard's own package is installed (torch.utils.tensorboard needs it)
_TENSORBOARD_AVAILABLE = importlib.util.find_spec("tensorboard") is not None


class TensorBoardLogger(FileLogger):
    """Event files for TensorBoard and ``hparams.yaml`` in ``save_dir/name/version_N``.

    ``log_graph=True`` adds the module's graph (traced on ``example_input_array``) when the run starts;
    ``prefix`` goes before every metric name; ``sub_dir`` is one more level under the version; other
    keyword arguments go to ``SummaryWriter`` (``max_queue``, ``flush_secs``).
    """

    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir: str | os.PathLike, name: str | None = "lightning_logs", version: int | str | None = None,
                 log_graph: bool = False, default_hp_metric: bool = True, prefix: str = "",
                 sub_dir: str | os.PathLike | None = None, **kwargs: Any):
        super().__init__(save_dir, name, version)
        if log_graph and not _TENSORBOARD_AVAILABLE:
            warnings.warn("You set `TensorBoardLogger(log_graph=True)` but `tensorboard` is not available: "
                          "pip install tensorboard", stacklevel=2)
        self._log_graph = log_graph and _TENSORBOARD_AVAILABLE
        self._default_hp_metric, self._prefix = default_hp_metric, prefix
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._kwargs = kwargs
        self.hparams: dict[str, Any] = {}
        self._experiment = None

    @property
    def sub_dir(self) -> str | None:
        return self._sub_dir

    @property
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        path = os.path.join(self.root_dir, version)
        if isinstance(self._sub_dir, str):
            path = os.path.join(path, self._sub_dir)
        return os.path.expanduser(os.path.expandvars(path))

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """Torch's ``SummaryWriter`` on this run's ``log_dir``: ``logger.experiment.add_image(...)``."""
        if self._experiment is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ModuleNotFoundError("TensorBoardLogger needs tensorboard: pip install tensorboard "
                                          "(or use CSVLogger)") from err
            if self.root_dir:
                filesystem(self.root_dir).makedirs(self.root_dir, exist_ok=True)
            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._kwargs)
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, torch.Tensor):
                value = value.item()
            if isinstance(value, dict):
                self.experiment.add_scalars(key, value, step)
                continue
            try:
                self.experiment.add_scalar(key, value, step)
            except Exception as err:
                raise ValueError(f"TensorBoardLogger cannot log {key}={value!r}: log a number, a one-element tensor "
                                 "or a dict of them") from err

    def log_hyperparams(self, params: Any = None, metrics: Mapping[str, Any] | Any = None,
                        step: int | None = None) -> None:
        params = convert_params(params)
        try:
            from omegaconf import Container, OmegaConf
        except ImportError:
            Container = None
        if Container is not None and isinstance(params, Container):
            self.hparams = OmegaConf.merge(self.hparams, params)
            params = OmegaConf.to_container(params, resolve=True)
        else:
            self.hparams.update(params)
        flat = sanitize_params(flatten_dict(params))
        # TensorBoard's HParams take scalars only: a tensor or array of several values goes as its text
        flat = {k: str(v) if getattr(v, "ndim", 0) > 1 else v for k, v in flat.items()}
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else None
        elif not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        if metrics:
            self.log_metrics(metrics, step)
            from torch.utils.tensorboard.summary import hparams
            writer = self.experiment._get_file_writer()
            for summary in hparams(flat, dict(metrics)):
                writer.add_summary(summary, step)

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        if not self._log_graph:
            return
        input_array = getattr(model, "example_input_array", None) if input_array is None else input_array
        if input_array is None:
            warnings.warn("Could not log computational graph to TensorBoard: The `model.example_input_array` "
                          "attribute is not set or `input_array` was not given.", UserWarning, stacklevel=2)
        elif not isinstance(input_array, (torch.Tensor, tuple)):
            warnings.warn("Could not log computational graph to TensorBoard: The `input_array` or "
                          f"`model.example_input_array` has type {type(input_array)} which can't be traced by "
                          "TensorBoard. Make the input array a tuple representing the positional arguments to the "
                          "model's `forward()` implementation.", UserWarning, stacklevel=2)
        else:
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
            moved = input_array.to(device) if isinstance(input_array, torch.Tensor) else \
                tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in input_array)
            # tracing reads every attribute of the module: a module outside a fit must not raise for `trainer`
            flagged = [m for m in model.modules() if getattr(m, "_jit_is_scripting", None) is False]
            for m in flagged:
                m._jit_is_scripting = True
            try:
                self.experiment.add_graph(model, moved)
            finally:
                for m in flagged:
                    m._jit_is_scripting = False

    def save(self) -> None:
        self.experiment.flush()
        hparams_file = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        fs = filesystem(self.log_dir)
        if fs.isdir(self.log_dir) and not fs.isfile(hparams_file):
            from gpulayer.trainer.core.saving import save_hparams_to_yaml
            save_hparams_to_yaml(hparams_file, self.hparams)

    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            self.experiment.flush()
            self.experiment.close()
        if status == "success":
            self.save()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_experiment"] = None  # the writer holds threads and open files; the copy makes its own
        return state
