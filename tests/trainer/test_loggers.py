"""CSVLogger and hyperparameter logging write what Lightning's write for the same run."""

from __future__ import annotations

import csv
import importlib.util
import os
import warnings
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.trainer import CSVLogger, Trainer, TrainerConfigError
from tests.trainer import twin


def _read(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_rows_append_and_a_new_column_rewrites_the_file_with_sorted_columns(tmp_path):
    logger = CSVLogger(tmp_path, name="exp")
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    logger.log_metrics({"loss": 0.5}, step=1)
    logger.save()
    logger.save()  # nothing new: nothing written
    assert _read(logger.metrics_file_path) == [{"loss": "1.0", "step": "0"}, {"loss": "0.5", "step": "1"}]
    logger.log_metrics({"val_loss": 0.7, "epoch": 0}, step=1)
    logger.log_metrics({"loss": torch.tensor(0.25)}, step=2)  # tensors are written as numbers
    logger.save()
    rows = _read(logger.metrics_file_path)
    assert list(rows[0]) == ["epoch", "loss", "step", "val_loss"]  # Lightning sorts the header
    assert [r["loss"] for r in rows] == ["1.0", "0.5", "", "0.25"] and rows[2]["val_loss"] == "0.7"


def test_csv_logger_flushes_every_n_steps_and_names_its_directories_as_lightning(tmp_path):
    logger = CSVLogger(tmp_path, name="exp", prefix="train", flush_logs_every_n_steps=2)
    assert (logger.save_dir, logger.name, logger.root_dir) == (str(tmp_path), "exp", str(tmp_path / "exp"))
    assert logger.version == 0 and logger.log_dir == str(tmp_path / "exp" / "version_0")
    logger.log_metrics({"a": 1.0}, step=0)
    assert not os.path.exists(logger.metrics_file_path)  # step 0: (0 + 1) % 2 != 0, still buffered
    logger.log_metrics({"a": 2.0}, step=1)
    assert [r["train-a"] for r in _read(logger.metrics_file_path)] == ["1.0", "2.0"]
    assert CSVLogger(tmp_path, name="exp").version == 1  # version_0 exists now
    assert CSVLogger(tmp_path, name="exp", version="run").log_dir == str(tmp_path / "exp" / "run")


def test_hparams_yaml_holds_the_saved_hyperparameters_only_when_saved(tmp_path):
    yaml = pytest.importorskip("yaml")

    class Net(gl.LightningModule):
        def __init__(self, lr=0.1, layers=(1, 2), save=True):
            super().__init__()
            if save:
                self.save_hyperparameters()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    for save in (True, False):
        logger = CSVLogger(tmp_path / str(save))
        gl.Trainer(max_epochs=1, logger=logger, enable_progress_bar=False, enable_checkpointing=False,
                   enable_model_summary=False).fit(Net(layers=[1, 2], save=save), loader)
        hparams = os.path.join(logger.log_dir, "hparams.yaml")
        assert os.path.isfile(hparams) is save and not os.path.exists(os.path.join(logger.log_dir, "hparams.json"))
    with open(tmp_path / "True" / "lightning_logs" / "version_0" / "hparams.yaml") as f:
        assert yaml.safe_load(f) == {"lr": 0.1, "layers": [1, 2], "save": True}


def _write_both(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    files = {}
    for side, mod in (("gl", gl), ("pl", pl)):
        class Net(mod.LightningModule):
            def __init__(self, lr=0.1, name="x"):
                super().__init__()
                self.save_hyperparameters()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                loss = self.layer(batch[0]).pow(2).mean()
                self.log("train_loss", loss, on_epoch=True)
                return loss

            def validation_step(self, batch, batch_idx):
                self.log("val_loss", self.layer(batch[0]).mean())

            def test_step(self, batch, batch_idx):
                self.log("test_loss", self.layer(batch[0]).mean())

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

        loader = DataLoader(TensorDataset(torch.randn(32, 2, generator=torch.Generator().manual_seed(0))), batch_size=4)
        logger = (CSVLogger if side == "gl" else pl.loggers.CSVLogger)(tmp_path / side, flush_logs_every_n_steps=3)
        kw = dict(accelerator="cpu", devices=1) if side == "pl" else {}
        trainer = mod.Trainer(max_epochs=2, logger=logger, log_every_n_steps=2, enable_progress_bar=False,
                              enable_model_summary=False, enable_checkpointing=False, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Net(), loader, loader)
            trainer.test(trainer.lightning_module, loader, verbose=False)
        files[side] = logger.log_dir
    return files


def test_csv_logger_writes_the_files_lightning_writes_for_the_same_run(tmp_path):
    dirs = _write_both(tmp_path)
    assert sorted(os.listdir(dirs["gl"])) == sorted(os.listdir(dirs["pl"])) == ["hparams.yaml", "metrics.csv"]
    with open(os.path.join(dirs["gl"], "hparams.yaml")) as a, open(os.path.join(dirs["pl"], "hparams.yaml")) as b:
        assert a.read() == b.read()
    ours, theirs = _read(os.path.join(dirs["gl"], "metrics.csv")), _read(os.path.join(dirs["pl"], "metrics.csv"))
    assert list(ours[0]) == list(theirs[0])  # the same columns in the same order
    # the same rows: which metrics, at which step and epoch (values differ with the initial weights)
    assert [(r["epoch"], sorted(k for k, v in r.items() if v and k not in ("epoch", "step"))) for r in ours] == \
        [(r["epoch"], sorted(k for k, v in r.items() if v and k not in ("epoch", "step"))) for r in theirs]
    assert any(r["test_loss"] for r in ours)


def _buffering_run(L, logger_base) -> list:
    """A logger that keeps what it got until ``finalize``; callbacks log from the last hook of each stage."""

    class Buffer(logger_base):
        def __init__(self):
            super().__init__()
            self.buffer, self.finalized = {}, []

        name = property(lambda self: "buffer")
        version = property(lambda self: 1)
        experiment = property(lambda self: None)

        def log_metrics(self, metrics, step=None):
            self.buffer.update(metrics)

        def log_hyperparams(self, *args, **kwargs):
            pass

        def finalize(self, status):
            self.finalized.append(sorted(self.buffer))

    class LogsLast(L.Callback):
        def on_fit_end(self, trainer, pl_module):
            trainer.logger.log_metrics({"fit": 1})

        def on_test_end(self, trainer, pl_module):
            trainer.logger.log_metrics({"test": 1})

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def test_step(self, batch, batch_idx):
            pass

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = Buffer()
    trainer = L.Trainer(max_epochs=1, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[LogsLast()])
    model = Net()
    trainer.fit(model, twin.loader())
    trainer.test(model, twin.loader(), verbose=False)
    return logger.finalized


def test_loggers_are_finalized_after_the_last_hooks_of_a_stage():
    from gpulayer.trainer.loggers.logger import Logger
    ours = _buffering_run(twin.gpulayer_ns(), Logger)
    assert ours == [["fit"], ["fit", "test"]]
    if importlib.util.find_spec("lightning") is not None:
        from lightning.pytorch.loggers.logger import Logger as LightningLogger
        assert _buffering_run(twin.lightning_ns(), LightningLogger) == ours


def test_any_object_with_a_loggers_methods_is_a_logger_and_others_are_refused():
    logger = mock.Mock()
    assert Trainer(logger=logger).logger is logger
    with pytest.raises(TrainerConfigError, match=r"lacks \['log_metrics'"):
        Trainer(logger=object())
