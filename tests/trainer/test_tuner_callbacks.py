"""The Tuner as Lightning documents it beyond the search itself: the trainer's loaders after a batch-size search,
Lightning's refusals and warnings, the ``BatchSizeFinder`` / ``LearningRateFinder`` callbacks, repeatable lr_find."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader

from gpulayer.trainer import Trainer
from gpulayer.trainer.callbacks import BatchSizeFinder, EarlyStopping, LearningRateFinder
from gpulayer.trainer.demos.boring_classes import BoringModel, RandomDataset
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.tuner import Tuner
from gpulayer.trainer import seed_everything

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


class Sized(BoringModel):
    def __init__(self, batch_size=2, fail_over: int | None = None):
        super().__init__()
        self.batch_size, self.fail_over = batch_size, fail_over

    def training_step(self, batch, batch_idx):
        if self.fail_over is not None and self.batch_size > self.fail_over:
            raise RuntimeError("CUDA error: out of memory")
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)


def test_after_a_search_the_trainers_loaders_have_the_size_found_and_the_messages_are_lightnings(caplog):
    trainer = Trainer(max_epochs=1, **QUIET)
    with caplog.at_level(logging.INFO):
        size = Tuner(trainer).scale_batch_size(Sized(16), init_val=8, max_trials=2, steps_per_trial=1)
    assert size == 16 and trainer.train_dataloader.batch_size == 16 and trainer.val_dataloaders.batch_size == 16
    assert caplog.text.count("trying batch size") == 1  # the last trial is not followed by a doubled one
    with caplog.at_level(logging.INFO):
        assert Tuner(Trainer(**QUIET)).scale_batch_size(Sized(), init_val=64, steps_per_trial=1) == 64
    assert "The batch size 64 is greater or equal than the length of your dataset: 64." in caplog.text


def test_binsearch_counts_successes_and_bisects_from_the_first_failure():
    class Long(Sized):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 1000), batch_size=self.batch_size)

    model = Long(16, fail_over=100)
    model.validation_step = None
    size = Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(
        model, mode="binsearch", init_val=500, max_trials=10, steps_per_trial=1)
    # 500, 250, 125 fail; 63 works; then between 63 and 125 up to 100; 5% margin: int(100 * 0.95)
    assert size == 95 == model.batch_size


def test_a_failed_size_at_or_over_the_dataset_length_still_shrinks():
    model = Sized(16, fail_over=40)
    model.validation_step = None
    size = Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(model, mode="binsearch", init_val=500, margin=0.0,
                                                                  steps_per_trial=1)
    assert size == 40  # 500 fails although the data has 64 samples: 250, 125, 63 fail, then 32 works, up to 40


def test_refusals_and_the_duplicate_field_warning_are_lightnings():
    tuner = Tuner(Trainer(**QUIET))
    with pytest.raises(MisconfigurationException, match="Batch size finder cannot be used with dataloaders passed"):
        tuner.scale_batch_size(Sized(), train_dataloaders=Sized().train_dataloader())

    class TwoVal(BoringModel):
        def val_dataloader(self):
            return [super().val_dataloader(), super().val_dataloader()]

    with pytest.raises(MisconfigurationException, match="cannot be used with multiple val dataloaders"):
        tuner.scale_batch_size(TwoVal(), method="validate")

    class Both(BoringModel):
        def __init__(self, batch_size=1):
            super().__init__()
            self.batch_size = 1
            self.save_hyperparameters()

    with pytest.warns(UserWarning, match="Field `model.batch_size` and `model.hparams.batch_size` are mutually"):
        Tuner(Trainer(max_steps=1, **QUIET)).scale_batch_size(Both(), max_trials=1, steps_per_trial=1)
    with pytest.raises(MisconfigurationException, match="not supported with distributed strategies"):
        BatchSizeFinder().setup(Trainer(devices=2, strategy="ddp", accelerator="cpu"), BoringModel())


@pytest.mark.parametrize("fn", ["fit", "test"])
def test_batch_size_finder_callback_runs_the_stage_at_the_size_found(fn):
    model = Sized(2)
    trainer = Trainer(max_epochs=1, callbacks=[BatchSizeFinder(max_trials=4, steps_per_trial=1)], **QUIET)
    getattr(trainer, fn)(model)
    assert model.batch_size == 16  # 2 -> 4 -> 8 -> 16: four trials
    if fn == "fit":
        assert trainer.global_step == 64 // 16 and trainer.train_dataloader.batch_size == 16
        assert trainer.num_val_batches[0] == 64 // 16  # the search's limits are gone in the real fit
    else:
        assert trainer.global_step == 0 and trainer.test_dataloaders.batch_size == 16


def test_lr_find_called_twice_finds_the_same_and_leaves_the_random_state():
    seed_everything(1)
    model = BoringModel()
    model.lr = 0.1
    tuner = Tuner(Trainer(max_epochs=2, limit_train_batches=10, limit_val_batches=2, **QUIET))
    before = torch.get_rng_state()
    first, second = tuner.lr_find(model), tuner.lr_find(model)
    assert first.results == second.results and len(first.results["lr"]) > 10
    assert torch.equal(torch.get_rng_state(), before)


def test_lr_find_with_accumulation_counts_batches_as_lightning():
    model = BoringModel()
    model.lr = 1e-3
    finder = Tuner(Trainer(accumulate_grad_batches=2, **QUIET)).lr_find(model, early_stop_threshold=None)
    assert len(finder.results["lr"]) == 100 and finder._total_batch_idx == 199


def test_learning_rate_finder_callback_trains_at_the_suggestion_on_the_fits_own_loaders():
    class PairModel(BoringModel):
        def __init__(self, lr=1e-5):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(8, 8)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=100)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss_epoch"}}

        def on_train_epoch_end(self):
            self.log("train_loss_epoch", 1.0)

    seed_everything(3)
    pairs = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 8))
    finder = LearningRateFinder(num_training_steps=30)
    trainer = Trainer(max_epochs=1, limit_val_batches=0, callbacks=[finder, EarlyStopping("train_loss_epoch", patience=5)],
                      **QUIET)
    trainer.fit(PairModel(), DataLoader(pairs, batch_size=16))
    suggestion = finder.optimal_lr.suggestion()
    assert suggestion is not None and trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(suggestion)
