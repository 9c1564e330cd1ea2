"""Loop flags as Lightning 2.6 runs them: val_check_interval, check_val_every_n_epoch, limits, overfit_batches,
reload_dataloaders_every_n_epochs, several train loaders, and the order loaders are requested in."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import lightning.pytorch as lp
from lightning.pytorch.demos.boring_classes import BoringModel as LBoringModel

from gpulayer.trainer import Trainer, TrainerConfigError
from gpulayer.trainer.demos.boring_classes import BoringModel, RandomDataset
from gpulayer.trainer.utilities import CombinedLoader
from gpulayer.trainer.utilities.combined_loader import CombinedLoader as CombinedLoaderAtLightningPath

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _counting(base):
    class Counting(base):
        def __init__(self):
            super().__init__()
            self.val_epochs = 0
            self.requests: list[str] = []

        def on_validation_epoch_start(self):
            if not self.trainer.sanity_checking:
                self.val_epochs += 1

        def train_dataloader(self):
            self.requests.append("train_dataloader")
            return DataLoader(RandomDataset(32, 20), batch_size=2)  # 10 batches

        def val_dataloader(self):
            self.requests.append("val_dataloader")
            return DataLoader(RandomDataset(32, 4), batch_size=2)

    return Counting


def _fit_both(**kwargs):
    ours, theirs = _counting(BoringModel)(), _counting(LBoringModel)()
    Trainer(**QUIET, **kwargs).fit(ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lp.Trainer(**QUIET, accelerator="cpu", **kwargs).fit(theirs)
    return ours, theirs


@pytest.mark.parametrize("interval, expected", [(1 / 3, 3), (0.25, 5), (0.5, 2), (1.0, 1), (3, 3), (5, 2), (10, 1)])
def test_val_check_interval_validates_as_often_as_lightning(interval, expected):
    ours, theirs = _fit_both(max_epochs=1, val_check_interval=interval, num_sanity_val_steps=0)
    assert theirs.val_epochs == expected
    assert ours.val_epochs == expected


def test_val_check_interval_int_counts_across_epochs_without_check_val_every_n_epoch():
    ours, theirs = _fit_both(max_epochs=3, val_check_interval=7, check_val_every_n_epoch=None, num_sanity_val_steps=0)
    assert ours.val_epochs == theirs.val_epochs == 4  # after batches 7, 14, 21, 28 of 30


def test_val_check_interval_longer_than_the_epoch_is_refused_naming_the_fix():
    with pytest.raises(TrainerConfigError, match=r"`val_check_interval` \(11\) must be less than or equal to the "
                                                 r"number of the training batches \(10\).*check_val_every_n_epoch=None"):
        Trainer(**QUIET, max_epochs=1, val_check_interval=11).fit(_counting(BoringModel)())


def test_val_dataloader_is_requested_before_train_dataloader():
    ours, theirs = _fit_both(max_epochs=1)
    assert ours.requests == theirs.requests == ["val_dataloader", "train_dataloader"]


def test_reload_dataloaders_every_n_epochs_requests_them_again():
    ours, theirs = _fit_both(max_epochs=4, reload_dataloaders_every_n_epochs=2, limit_train_batches=2,
                             limit_val_batches=1)
    assert sorted(ours.requests) == sorted(theirs.requests)
    assert ours.requests.count("train_dataloader") == 2


def test_limits_set_the_trainer_batch_counts():
    trainer = Trainer(**QUIET, max_epochs=1, limit_train_batches=0.5, limit_val_batches=3)
    trainer.fit(_counting(BoringModel)())
    assert (trainer.limit_train_batches, trainer.limit_val_batches) == (0.5, 3)
    assert trainer.num_training_batches == 5
    assert trainer.num_val_batches == [2]


def test_fractional_limit_that_leaves_no_batch_is_refused():
    with pytest.raises(TrainerConfigError, match=r"Try at least `limit_train_batches=0.1`"):
        Trainer(**QUIET, max_epochs=1, limit_train_batches=0.01).fit(_counting(BoringModel)())


def test_overfit_batches_trains_on_the_same_batches_and_turns_shuffle_off():
    seen = []

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            seen.append(batch.sum().item())
            return super().training_step(batch, batch_idx)

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 20), batch_size=2, shuffle=True)

    trainer = Trainer(**QUIET, max_epochs=2, overfit_batches=2)
    with pytest.warns(UserWarning, match="We are turning off the train dataloader shuffling"):
        trainer.fit(Model())
    assert trainer.limit_train_batches == trainer.limit_val_batches == 2
    assert trainer.num_training_batches == 2
    assert seen[:2] == seen[2:]


def test_several_train_loaders_give_training_step_a_dict_of_batches_cycling_the_shorter():
    shapes = []

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            shapes.append({k: v.shape[0] for k, v in batch.items()})
            return super().training_step(batch["a"], batch_idx)

    loaders = {"a": DataLoader(RandomDataset(32, 8), batch_size=2), "b": DataLoader(RandomDataset(32, 4), batch_size=4)}
    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(Model(), train_dataloaders=loaders)
    assert len(shapes) == trainer.num_training_batches == 4  # max_size_cycle: the longest decides
    assert shapes[0] == {"a": 2, "b": 4}
    assert set(trainer.train_dataloader) == {"a", "b"}


@pytest.mark.parametrize("mode, expected", [("min_size", 1), ("max_size_cycle", 4), ("max_size", 4)])
def test_combined_loader_mode_sets_the_epoch_length(mode, expected):
    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch[0], batch_idx)

    combined = CombinedLoader([DataLoader(RandomDataset(32, 8), batch_size=2),
                               DataLoader(RandomDataset(32, 4), batch_size=4)], mode)
    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(Model(), train_dataloaders=combined)
    assert trainer.num_training_batches == expected


@pytest.mark.parametrize("mode", ["min_size", "max_size_cycle", "max_size", "sequential"])
def test_combined_loader_yields_what_lightnings_yields(mode):
    iterables = {"x": [range(2), range(3)], "y": range(5)}
    ours = list(CombinedLoaderAtLightningPath(iterables, mode))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs_loader = lp.utilities.CombinedLoader(iterables, mode)
        theirs = list(theirs_loader)
    assert ours == theirs
    combined = CombinedLoader(iterables, mode)
    iter(combined)  # as Lightning's, its length is known once iteration started
    assert len(combined) == len(theirs_loader)
    assert CombinedLoader is CombinedLoaderAtLightningPath


def test_combined_loader_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="Unsupported mode 'zip'"):
        CombinedLoader([range(2)], "zip")


def test_training_batch_is_a_tensor_for_one_loader():
    got = []

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            got.append(type(batch))
            return super().training_step(batch, batch_idx)

    Trainer(**QUIET, max_steps=1).fit(Model())
    assert got == [torch.Tensor]


def test_overfit_batches_validates_on_the_numbers_it_trains_on_as_lightning():
    """Lightning requests val_dataloader inside its sanity check, whose random state is restored: a
    RandomDataset built in val_dataloader() and one built in train_dataloader() hold the same numbers."""

    def first_batches(base, trainer_cls, **extra):
        class Model(base):
            def __init__(self):
                super().__init__()
                self.train_batches, self.val_batches = [], []

            def training_step(self, batch, batch_idx):
                self.train_batches.append(batch)
                return super().training_step(batch, batch_idx)

            def validation_step(self, batch, batch_idx):
                self.val_batches.append(batch)
                return super().validation_step(batch, batch_idx)

        torch.manual_seed(3)
        model = Model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer_cls(**QUIET, max_epochs=2, overfit_batches=1, **extra).fit(model)
        return model.train_batches[0], model.val_batches[0]

    ours = first_batches(BoringModel, Trainer)
    theirs = first_batches(LBoringModel, lp.Trainer, accelerator="cpu")
    assert torch.equal(ours[0], ours[1]) and torch.equal(theirs[0], theirs[1])
    assert torch.equal(ours[0], theirs[0])


def _request_epochs(base, trainer_cls, **kwargs):
    """(epoch of each train request, of each val request outside the sanity check, of each validation)."""
    class Model(base):
        def __init__(self):
            super().__init__()
            self.train_requests, self.val_requests, self.val_epochs = [], [], []

        def train_dataloader(self):
            self.train_requests.append(self.current_epoch)
            return super().train_dataloader()

        def val_dataloader(self):
            if not self.trainer.sanity_checking:
                self.val_requests.append(self.current_epoch)
            return super().val_dataloader()

        def on_validation_epoch_start(self):
            if not self.trainer.sanity_checking:
                self.val_epochs.append(self.current_epoch)

    model = Model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer_cls(**QUIET, max_epochs=7, limit_train_batches=1, limit_val_batches=1, **kwargs).fit(model)
    return model.train_requests, model.val_requests, model.val_epochs


@pytest.mark.parametrize("sanity", [0, 1])
@pytest.mark.parametrize("every_n, reload_n", [(1, 1), (1, 2), (3, 2), (2, 3), (3, 4)])
def test_reload_with_infrequent_validation_requests_in_the_epochs_lightning_does(sanity, every_n, reload_n):
    kwargs = dict(num_sanity_val_steps=sanity, check_val_every_n_epoch=every_n,
                  reload_dataloaders_every_n_epochs=reload_n)
    assert _request_epochs(BoringModel, Trainer, **kwargs) == \
        _request_epochs(LBoringModel, lp.Trainer, accelerator="cpu", **kwargs)


def test_fit_refuses_a_sequential_combined_loader_after_counting_its_batches():
    combined = CombinedLoader([DataLoader(RandomDataset(32, 8), batch_size=2),
                               DataLoader(RandomDataset(32, 4), batch_size=2)], "sequential")
    trainer = Trainer(**QUIET, max_epochs=1)
    with pytest.raises(TrainerConfigError, match=r'FitLoop` does not support the `CombinedLoader\(mode="sequential"\)'):
        trainer.fit(BoringModel(), train_dataloaders=combined)
    assert trainer.num_training_batches == 6
