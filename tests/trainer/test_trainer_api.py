"""Lightning's smaller public Trainer and module API: freeze, init_module, detect_anomaly, errors and messages."""

from __future__ import annotations

import logging
import math
from unittest import mock

import pytest
import torch

from gpulayer.trainer import Callback, Trainer
from gpulayer.trainer.callbacks import EarlyStopping, ModelCheckpoint
from gpulayer.trainer.demos.boring_classes import BoringModel
from gpulayer.trainer.utilities.warnings import PossibleUserWarning
from tests.trainer.twin import both, needs_lightning

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def test_freeze_and_unfreeze_return_the_module():
    model = BoringModel()
    assert model.freeze() is model and not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.unfreeze() is model and model.training
    assert all(p.requires_grad for p in model.parameters())


def test_a_subclass_adds_its_own_arguments_and_unknown_ones_are_a_type_error():
    class MyTrainer(Trainer):
        def __init__(self, custom, *args, flag="x", **kwargs):
            super().__init__(*args, **kwargs)
            self.custom, self.flag = custom, flag

    trainer = MyTrainer(3, flag="y", fast_dev_run=True)
    trainer.fit(BoringModel())
    assert (trainer.custom, trainer.flag, trainer.fast_dev_run) == (3, "y", True)
    with pytest.raises(TypeError, match=r"__init__\(\) got an unexpected keyword argument 'max_epoch'; did you mean"):
        MyTrainer(1, max_epoch=3)


def test_missing_checkpoint_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="Checkpoint file not found"):
        Trainer(max_steps=1, **QUIET).fit(BoringModel(), ckpt_path=tmp_path / "nope.ckpt")


def test_save_checkpoint_without_a_model_names_the_fix():
    with pytest.raises(AttributeError, match="only possible if a model is attached"):
        Trainer(**QUIET).save_checkpoint("x.ckpt")


def test_resuming_without_a_callback_of_the_checkpoint_warns(tmp_path):
    class Stateful(Callback):
        def state_dict(self):
            return {"a": 1}

    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, default_root_dir=tmp_path, logger=False,
            enable_progress_bar=False, callbacks=[ckpt, Stateful()]).fit(BoringModel())
    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, default_root_dir=tmp_path,
                      logger=False, enable_progress_bar=False)
    with pytest.warns(UserWarning, match=r"Please add the following callbacks: \[.*Stateful'\]"):
        trainer.fit(BoringModel(), ckpt_path=ckpt.last_model_path)
    saved = torch.load(ckpt.last_model_path, weights_only=False)["callbacks"]
    assert all(saved.values())  # callbacks without a state (the progress bar) are not saved


def test_strategy_hears_about_a_failed_run():
    from gpulayer.trainer.strategies.strategy import Strategy

    class Boom(BoringModel):
        def on_fit_start(self):
            raise RuntimeError("boom")

    with mock.patch.object(Strategy, "on_exception") as on_exception, pytest.raises(RuntimeError, match="boom"):
        Trainer(**QUIET).fit(Boom())
    assert isinstance(on_exception.call_args.args[0], RuntimeError)


def test_current_fx_name_is_the_running_hook_and_none_after():
    seen = []

    class Watch(BoringModel):
        def on_train_epoch_start(self):
            seen.append(self._current_fx_name)

    model = Watch()
    Trainer(fast_dev_run=1, **QUIET).fit(model)
    assert seen == ["on_train_epoch_start"] and model._current_fx_name is None


def test_init_module_creates_on_the_run_device_and_can_skip_init():
    trainer = Trainer(accelerator="cpu", **QUIET)
    with trainer.init_module():
        assert BoringModel().device == torch.device("cpu")
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    with trainer.init_module(empty_init=True):
        layer = torch.nn.Linear(3, 3)
    assert layer.weight.shape == (3, 3)
    assert torch.equal(torch.rand(1), expected)  # no initializer drew random numbers


def test_detect_anomaly_names_the_forward_that_made_nan():
    class Nan(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            return {"loss": out["loss"] * torch.tensor(float("nan"))}

    with pytest.raises(RuntimeError, match="returned nan values"), \
            pytest.warns(UserWarning, match="Traceback of forward call"):
        Trainer(detect_anomaly=True, max_steps=1, **QUIET).fit(Nan())
    assert not torch.is_anomaly_enabled()


def test_max_epochs_not_set_warns_once_fit_starts():
    trainer = Trainer(limit_train_batches=1, limit_val_batches=0, max_steps=-1, **QUIET)

    class StopNow(BoringModel):
        def training_step(self, batch, batch_idx):
            self.trainer.should_stop = True
            return super().training_step(batch, batch_idx)

    with pytest.warns(PossibleUserWarning, match="`max_epochs` was not set. Setting it to 1000 epochs"):
        trainer.fit(StopNow())
    assert trainer.max_epochs == 1000


def test_min_epochs_not_met_is_said_once(caplog):
    class Flat(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("loss", out["loss"] * 0)
            return out

    trainer = Trainer(min_epochs=4, max_epochs=10, limit_train_batches=2, limit_val_batches=0, **QUIET,
                      callbacks=[EarlyStopping(monitor="loss", patience=0, check_on_train_epoch_end=True)])
    with caplog.at_level(logging.INFO):
        trainer.fit(Flat())
    said = [r for r in caplog.records if "`min_epochs=4` or `min_steps=None` has not been met" in r.getMessage()]
    assert len(said) == 1 and trainer.current_epoch == 4


def _grad_modes(L, inference_mode):
    seen = []

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def on_validation_start(self):
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

        def on_validation_end(self):
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

        def validation_step(self, batch, batch_idx):
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, 2)))
    L.Trainer(inference_mode=inference_mode, limit_val_batches=1, **QUIET).validate(Model(), data, verbose=False)
    return seen


@needs_lightning
@pytest.mark.parametrize("inference_mode", [True, False])
def test_evaluation_hooks_run_under_the_chosen_no_grad_mode(inference_mode):
    assert both(_grad_modes, inference_mode) == [(False, inference_mode)] * 3


def test_barebones_and_profiler_are_trainer_properties():
    trainer = Trainer(**QUIET)
    assert trainer.barebones is False and type(trainer.profiler).__name__ == "PassThroughProfiler"
    assert not math.isnan(trainer.log_every_n_steps)


def test_a_fitted_trainer_and_its_model_save_with_torch(tmp_path):
    trainer = Trainer(max_steps=2, limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(BoringModel())
    torch.save(trainer.model, tmp_path / "model.pt")
    torch.save(trainer, tmp_path / "trainer.pt")
    assert torch.load(tmp_path / "trainer.pt", weights_only=False).global_step == 2


def _eval_mode_warnings(L):
    import warnings

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.frozen = torch.nn.Linear(2, 2).eval()

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.layer.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        L.Trainer(max_epochs=1, **QUIET).fit(Model(), data)
    return [str(w.message).split(".")[0] for w in seen if "eval mode" in str(w.message)]


@needs_lightning
def test_modules_left_in_eval_mode_are_pointed_out():
    assert both(_eval_mode_warnings) == ["Found 1 module(s) in eval mode at the start of training"]
