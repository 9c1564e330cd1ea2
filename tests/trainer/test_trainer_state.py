"""trainer.state, Lightning's public Trainer properties, and Ctrl-C handled as Lightning 2.6 does."""

from __future__ import annotations

import math

import pytest
from torch.utils.data import DataLoader

from gpulayer.trainer import Callback, Trainer
from gpulayer.trainer.demos.boring_classes import BoringDataModule, BoringModel, RandomDataset
from gpulayer.trainer.loggers import CSVLogger
from gpulayer.trainer.trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def test_state_enums_compare_to_their_values_in_any_case():
    assert TrainerFn.FITTING == "fit" and TrainerFn.FITTING == "FIT"
    assert RunningStage.SANITY_CHECKING.evaluating and not RunningStage.TRAINING.evaluating
    assert RunningStage.SANITY_CHECKING.dataloader_prefix == "val"
    assert TrainerStatus.INTERRUPTED.stopped and not TrainerStatus.RUNNING.stopped


def test_new_trainer_is_initializing():
    assert Trainer(**QUIET).state == TrainerState(status=TrainerStatus.INITIALIZING, fn=None, stage=None)


def test_state_follows_fit_through_sanity_check_training_and_validation():
    seen = []

    class Watch(Callback):
        def on_sanity_check_start(self, trainer, module):
            seen.append(("sanity", trainer.state.fn, trainer.state.stage, trainer.sanity_checking))

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(("train", trainer.state.fn, trainer.state.stage, trainer.training))

        def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
            if not trainer.sanity_checking:
                seen.append(("val", trainer.state.fn, trainer.state.stage, trainer.validating))

        def on_test_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
            seen.append(("test", trainer.state.fn, trainer.state.stage, trainer.testing))

    trainer = Trainer(**QUIET, max_epochs=1, limit_train_batches=1, limit_val_batches=1, limit_test_batches=1,
                      callbacks=[Watch()])
    trainer.fit(BoringModel())
    assert trainer.state.finished and trainer.state.stage is None and trainer.state.fn == TrainerFn.FITTING
    trainer.test(BoringModel())
    assert trainer.state.finished and trainer.state.fn == TrainerFn.TESTING
    assert seen == [
        ("sanity", TrainerFn.FITTING, RunningStage.SANITY_CHECKING, True),
        ("train", TrainerFn.FITTING, RunningStage.TRAINING, True),
        ("val", TrainerFn.FITTING, RunningStage.VALIDATING, True),
        ("test", TrainerFn.TESTING, RunningStage.TESTING, True),
    ]


class _CtrlC(Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        raise KeyboardInterrupt


class _Record(Callback):
    def __init__(self):
        self.exception = None

    def on_exception(self, trainer, module, exception):
        self.exception = exception


def test_ctrl_c_runs_on_exception_finalizes_loggers_failed_and_exits_1(tmp_path):
    record, finalized = _Record(), []

    class Logger(CSVLogger):
        def finalize(self, status):
            finalized.append(status)

    class DataModule(BoringDataModule):
        def on_exception(self, exception):
            finalized.append(("datamodule", type(exception).__name__))

    trainer = Trainer(**{**QUIET, "logger": Logger(tmp_path)}, max_epochs=1, callbacks=[_CtrlC(), record])
    assert not trainer.interrupted
    with pytest.raises(SystemExit) as exc_info:
        trainer.fit(BoringModel(), datamodule=DataModule())
    assert exc_info.value.code == 1
    assert trainer.interrupted and trainer.state.status == TrainerStatus.INTERRUPTED
    assert isinstance(record.exception, KeyboardInterrupt)
    assert ("datamodule", "KeyboardInterrupt") in finalized and finalized[-1] == "failed"


def test_other_errors_propagate_after_on_exception():
    record = _Record()

    class Broken(Callback):
        def on_test_start(self, trainer, module):
            raise RuntimeError("broken")

    trainer = Trainer(**QUIET, callbacks=[Broken(), record])
    with pytest.raises(RuntimeError, match="broken"):
        trainer.test(BoringModel())
    assert trainer.interrupted and trainer.state.stage is None
    assert isinstance(record.exception, RuntimeError)


def test_trainer_reports_its_settings_and_what_the_fit_loaded():
    trainer = Trainer(**QUIET, max_epochs=2, limit_train_batches=4, limit_val_batches=0.5, limit_test_batches=2,
                      limit_predict_batches=3, num_sanity_val_steps=-1, accumulate_grad_batches=3)
    assert trainer.num_sanity_val_steps == math.inf
    class Model(BoringModel):
        def test_step(self, batch, batch_idx, dataloader_idx=0):
            return super().test_step(batch, batch_idx)

    model = Model()
    trainer.fit(model)
    assert (trainer.limit_train_batches, trainer.limit_val_batches) == (4, 0.5)
    assert (trainer.limit_test_batches, trainer.limit_predict_batches) == (2, 3)
    assert trainer.num_training_batches == 4 and trainer.num_val_batches == [32]
    assert trainer.num_sanity_val_batches == [32]
    assert isinstance(trainer.train_dataloader, DataLoader) and isinstance(trainer.val_dataloaders, DataLoader)
    assert trainer.enable_validation and trainer.lightning_module is model
    assert trainer.estimated_stepping_batches == 4  # ceil(4 / 3) * 2 epochs
    assert trainer.progress_bar_callback is None and not trainer.received_sigterm
    trainer.test(model, dataloaders=[DataLoader(RandomDataset(32, 8)), DataLoader(RandomDataset(32, 8))])
    assert isinstance(trainer.test_dataloaders, list) and len(trainer.test_dataloaders) == 2
    assert trainer.num_test_batches == [2, 2]


def test_world_size_after_a_two_process_ddp_fit_is_two():
    trainer = Trainer(**QUIET, accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, limit_train_batches=2,
                      limit_val_batches=1)
    assert trainer.world_size == 2 and trainer.num_devices == 2
    trainer.fit(BoringModel())
    assert (trainer.world_size, trainer.global_rank, trainer.is_global_zero) == (2, 0, True)
    assert (trainer.current_epoch, trainer.global_step, trainer.should_stop) == (1, 2, False)
    assert trainer.state.finished
