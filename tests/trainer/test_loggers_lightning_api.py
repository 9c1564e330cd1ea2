"""Lightning's logger API: the base class and its stand-ins, several loggers at once, CSV on any fsspec path,
TensorBoard's directory rules, hparams and graph; what the Trainer calls on them and when."""

from __future__ import annotations

import os
import pickle
import warnings
from argparse import Namespace
from unittest import mock

import fsspec
import pytest
import torch

from gpulayer.trainer import Trainer
from gpulayer.trainer.demos.boring_classes import BoringModel
from gpulayer.trainer.loggers import CSVLogger, DummyExperiment, DummyLogger, Logger, TensorBoardLogger
from gpulayer.trainer.loggers.csv_logs import ExperimentWriter
from gpulayer.trainer.loggers.logger import rank_zero_experiment
from gpulayer.trainer.loggers.params import flatten_dict, sanitize_params
from gpulayer.trainer.utilities.rank_zero import rank_zero_only

QUIET = dict(enable_progress_bar=False, enable_model_summary=False)


class Recording(Logger):
    def __init__(self):
        super().__init__()
        self.metrics, self.hparams, self.status, self.saved_checkpoints = [], None, None, 0

    @property
    def name(self):
        return "rec"

    @property
    def version(self):
        return "1"

    @property
    @rank_zero_experiment
    def experiment(self):
        return "the real experiment"

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        self.hparams = params

    def finalize(self, status):
        self.status = status

    def after_save_checkpoint(self, checkpoint_callback):
        self.saved_checkpoints += 1


class LogsLoss(BoringModel):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("train_loss", out["loss"])
        return out


def test_every_logger_of_a_list_gets_the_metrics_the_end_and_each_saved_checkpoint(tmp_path):
    first, second = Recording(), Recording()
    trainer = Trainer(default_root_dir=tmp_path, max_steps=2, log_every_n_steps=1, logger=[first, second], **QUIET)
    assert trainer.logger is first and trainer.loggers == [first, second]
    trainer.fit(LogsLoss())
    for logger in (first, second):
        assert [step for step, m in logger.metrics if "train_loss" in m] == [0, 1]
        assert logger.status == "success" and logger.saved_checkpoints >= 1
    trainer.logger = second  # setting the one logger replaces the list, as in Lightning
    assert trainer.loggers == [second]
    trainer.loggers = []
    assert trainer.logger is None


def test_a_trainer_with_several_loggers_pickles_and_its_copies_log():
    trainer = Trainer(logger=[Recording(), Recording()])
    copy = pickle.loads(pickle.dumps(trainer))
    for logger in copy.loggers:
        logger.log_metrics({"acc": 1.0}, 0)
    assert [lg.metrics for lg in copy.loggers] == [[(0, {"acc": 1.0})]] * 2


def test_other_ranks_get_a_dummy_experiment_that_accepts_anything():
    logger = Recording()
    assert logger.experiment == "the real experiment"
    with mock.patch.object(rank_zero_only, "rank", 1):
        exp = logger.experiment
        assert isinstance(exp, DummyExperiment)
        assert exp.add_image("x", 1, step=2) is None and exp[0].anything() is None
        exp["key"] = "value"  # item assignment is accepted and forgotten
        assert exp["key"] is exp


def test_dummy_logger_answers_every_method_and_logs_nowhere():
    logger = DummyLogger()
    logger.log_hyperparams("1", 2, three="three")
    logger.log_metrics("1", 2, three="three")
    assert logger.log_text("anything") is None and logger[0] is logger
    assert logger.name == "" and logger.version == "" and logger.log_dir is None


def test_fast_dev_run_logs_to_a_dummy_logger_and_the_bar_shows_no_version(tmp_path):
    trainer = Trainer(default_root_dir=tmp_path, fast_dev_run=True, enable_model_summary=False)
    model = BoringModel()
    trainer.fit(model)
    assert isinstance(trainer.logger, DummyLogger)
    assert "v_num" not in trainer.progress_bar_callback.get_metrics(trainer, model)
    assert not os.path.exists(tmp_path / "lightning_logs")


def test_a_value_logged_as_step_is_the_step_the_loggers_get(tmp_path):
    class StepLogging(BoringModel):
        def on_train_epoch_end(self):
            self.log_dict({"step": float(10 + self.current_epoch), "train_acc": 0.5})

    logger = Recording()
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=0,
                      logger=logger, **QUIET)
    trainer.fit(StepLogging())
    assert [(s, m) for s, m in logger.metrics if "train_acc" in m] == [(10, {"train_acc": 0.5}),
                                                                         (11, {"train_acc": 0.5})]


def test_experiments_exist_before_the_first_setup_hook(tmp_path):
    seen = {}

    class Check(BoringModel):
        def setup(self, stage):
            seen["writer"] = self.logger._experiment

    logger = CSVLogger(tmp_path)
    Trainer(default_root_dir=tmp_path, max_steps=1, logger=logger, **QUIET).fit(Check())
    assert isinstance(seen["writer"], ExperimentWriter)


def test_csv_logger_writes_to_an_fsspec_url_and_clears_an_earlier_run_of_the_same_version(tmp_path):
    logger = CSVLogger(save_dir="memory://tune44-csv")
    logger.experiment.log_metrics({"loss": 0.1})
    logger.save()
    fs = fsspec.core.url_to_fs("memory://tune44-csv")[0]
    assert fs.isfile(os.path.join(logger.log_dir, ExperimentWriter.NAME_METRICS_FILE))

    (tmp_path / "exp" / "version_0").mkdir(parents=True)
    old = tmp_path / "exp" / "version_0" / "metrics.csv"
    old.touch()
    with pytest.warns(UserWarning, match="Experiment logs directory .* exists and is not empty"):
        CSVLogger(tmp_path, name="exp", version=0).experiment
    assert not old.exists()


def test_csv_hparams_yaml_keeps_values_yaml_can_hold(tmp_path):
    from gpulayer.trainer.core.saving import load_hparams_from_yaml
    logger = CSVLogger(tmp_path)
    logger.log_hyperparams({"float": 0.3, "dict": {"a": {"b": "c"}}, "list": [1, 2], "layer": torch.nn.BatchNorm1d})
    params = load_hparams_from_yaml(os.path.join(logger.log_dir, ExperimentWriter.NAME_HPARAMS_FILE))
    assert set(params) == {"float", "dict", "list", "layer"} and params["layer"] is torch.nn.BatchNorm1d


def test_hparams_are_flattened_and_made_loggable_as_lightning_does():
    import numpy as np
    flat = flatten_dict({"a": {"b": 1}, 5: {"c": 2}, "ns": Namespace(x=3), "dl": [{"p": 1}, {"q": 2}], "l": [1, 2]})
    assert flat == {"a/b": 1, "5/c": 2, "ns/x": 3, "dl/0/p": 1, "dl/1/q": 2, "l": [1, 2]}
    clean = sanitize_params({"np": np.int64(4), "f": np.float32(0.5), "l": [1, 2], "t": torch.tensor(1.0)})
    assert clean["np"] == 4 and type(clean["np"]) is int and clean["f"] == 0.5 and clean["l"] == "[1, 2]"
    assert isinstance(clean["t"], torch.Tensor)


def test_tensorboard_log_dir_takes_sub_dir_and_expands_home_and_variables(tmp_path, monkeypatch):
    logger = TensorBoardLogger(tmp_path / "logs", name="n", version="v", sub_dir="s")
    assert logger.log_dir == os.path.join(tmp_path / "logs", "n", "v", "s")
    assert TensorBoardLogger("~/tb", version=0).log_dir == os.path.join(os.path.expanduser("~/tb"),
                                                                          "lightning_logs", "version_0")
    monkeypatch.setenv("TUNE44_DIR", "somewhere")
    assert TensorBoardLogger("$TUNE44_DIR/tb", name="", version=1).log_dir == os.path.join("somewhere/tb", "version_1")


def test_tensorboard_hyperparams_of_any_kind_and_metrics_are_written(tmp_path):
    logger = TensorBoardLogger(tmp_path, default_hp_metric=False)
    logger.log_hyperparams({"int": 1, "namespace": Namespace(foo=Namespace(bar="buzz")), "tensor": torch.empty(2, 2, 2),
                            123: 3, 5j: 5, "layer": torch.nn.BatchNorm1d}, {"abc": torch.tensor([0.54])})
    logger.finalize("success")
    files = os.listdir(logger.log_dir)
    assert "hparams.yaml" in files and any(f.startswith("events.out.tfevents") for f in files)


def test_tensorboard_graph_needs_an_input_it_can_trace(tmp_path):
    model = BoringModel()
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    with pytest.warns(UserWarning, match="Could not log computational graph to TensorBoard: The `model.example_input"):
        logger.log_graph(model)
    with pytest.warns(UserWarning, match="can't be traced by TensorBoard"):
        logger.log_graph(model, {"x": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        logger.log_graph(model, torch.rand(2, 32))  # a module outside any fit is traced too
    logger.finalize("success")
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(logger.log_dir))


def test_tensorboard_finalize_closes_the_writer_it_made_and_makes_none(tmp_path, monkeypatch):
    import torch.utils.tensorboard as tb
    writer = mock.Mock()
    monkeypatch.setattr(tb, "SummaryWriter", mock.Mock(return_value=writer))
    logger = TensorBoardLogger(tmp_path)
    logger.finalize("failed")
    assert logger._experiment is None
    logger.log_metrics({"x": 1.0}, 0)
    logger.finalize("failed")
    writer.flush.assert_called()
    writer.close.assert_called()
    writer.add_scalar.assert_called_once_with("x", 1.0, 0)
