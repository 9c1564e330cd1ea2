"""Lightning's documented behaviour of the progress bar's ``Tqdm``, ``CombinedLoader`` and ``save_hyperparameters``
in the forms issue 44 measured: what a user (or a custom bar) reaches for beyond a plain fit."""

from __future__ import annotations

from enum import Enum
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from gpulayer.trainer import LightningDataModule, LightningModule, Trainer
from gpulayer.trainer.callbacks import TQDMProgressBar
from gpulayer.trainer.callbacks.progress import tqdm_progress
from gpulayer.trainer.callbacks.progress.tqdm_progress import Tqdm
from gpulayer.trainer.core.saving import load_hparams_from_yaml, save_hparams_to_yaml
from gpulayer.trainer.demos.boring_classes import BoringModel
from gpulayer.trainer.utilities import CombinedLoader


@pytest.mark.parametrize(("value", "shown"), [(1, "1"), (1.0, "1.000"), (0.1, "0.100"), (1e-3, "0.001"),
                                              (1e-5, "1e-5"), ("1.0", "1.000"), ("10000", "10000"), ("abc", "abc")])
def test_tqdm_format_num_pads_floats_as_lightnings(value, shown):
    assert Tqdm.format_num(value) == shown


def test_tqdm_reset_keeps_the_total_and_a_description_carries_its_separator():
    bar = Tqdm(desc="Training", total=5, disable=True)
    bar.n = 3
    bar.reset()
    assert (bar.n, bar.total) == (0, 5)
    bar.set_description("Epoch 1")
    assert bar.desc == "Epoch 1: "


class Recorder(Tqdm):
    made: list = []

    def __init__(self, *args, **kwargs):
        self.ns = []
        super().__init__(*args, **kwargs)
        self.ns = []  # what the constructor set is not an update
        Recorder.made.append(self)

    @property
    def n(self):
        return self._n

    @n.setter
    def n(self, value):  # each new count the callback sets, as Lightning's MockTqdm records them
        self._n = value
        if not self.ns or self.ns[-1] != value:
            self.ns.append(value)


def test_bars_are_made_through_the_module_name_and_updated_at_the_refresh_rate(tmp_path):
    Recorder.made = []
    bar = TQDMProgressBar(refresh_rate=3)
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=5, limit_val_batches=2,
                      callbacks=[bar], logger=False, enable_checkpointing=False, num_sanity_val_steps=0)
    with mock.patch.object(tqdm_progress, "Tqdm", Recorder):
        trainer.fit(BoringModel())
    assert bar.train_progress_bar in Recorder.made and bar.train_progress_bar.ns == [0, 3, 5]
    assert bar.val_progress_bar.ns == [0, 2] and bar.train_progress_bar.total == 5


def test_module_print_goes_through_the_drawing_bar_and_tqdm_write(tmp_path):
    class Printing(BoringModel):
        def training_step(self, batch, batch_idx):
            self.print("training_step", end="")
            return super().training_step(batch, batch_idx)

    trainer = Trainer(default_root_dir=tmp_path, max_steps=1, limit_val_batches=0, logger=False,
                      enable_checkpointing=False, enable_model_summary=False)
    with mock.patch("tqdm.tqdm.write") as write:
        trainer.fit(Printing())
    assert write.call_args_list == [mock.call("training_step", end="")]


def test_combined_loader_length_after_iter_and_dataset_length_by_mode():
    with pytest.raises(RuntimeError, match="Please call `iter.*` first"):
        len(CombinedLoader([1, 2, 3]))
    loaders = [DataLoader(range(10)), DataLoader(range(20))]
    assert CombinedLoader(loaders, "max_size_cycle")._dataset_length() == 20
    assert CombinedLoader(loaders, "min_size")._dataset_length() == 10
    assert CombinedLoader(loaders, "sequential")._dataset_length() == 30

    class Unsized(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(NotImplementedError, match="All datasets are iterable-style"):
        CombinedLoader(DataLoader(Unsized()))._dataset_length()


@pytest.mark.parametrize(("mode", "batches"), [("min_size", 5), ("max_size_cycle", 10), ("max_size", 10),
                                               ("sequential", 15)])
def test_combined_loader_over_unsized_loaders_ends_when_they_run_out(mode, batches):
    class Counting(IterableDataset):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n))

    cl = CombinedLoader([DataLoader(Counting(10), batch_size=2), DataLoader(Counting(20), batch_size=2)], mode)
    assert sum(1 for _ in cl) == batches
    if mode == "max_size_cycle":
        assert all(cl._iterator._consumed)


@pytest.mark.parametrize("base", [LightningModule, LightningDataModule])
def test_a_module_built_in_another_modules_init_saves_both_argument_sets(base):
    class Child(base):
        def __init__(self, dropout, init_method):
            super().__init__()
            self.save_hyperparameters(ignore=["dropout"])

    class Parent(base):
        def __init__(self, batch_size, optimizer):
            super().__init__()
            self.child = Child(dropout=0.1, init_method="xavier")

    class Plain:  # not Lightning-like: its arguments are not collected
        def __init__(self, run_id="abc"):
            self.parent = Parent(batch_size=64, optimizer="adam")

    assert Plain().parent.child.hparams == {"init_method": "xavier", "batch_size": 64, "optimizer": "adam"}


def test_hparams_that_cannot_be_pickled_are_dropped_with_lightnings_warning(tmp_path):
    class Unpicklable(BoringModel):
        def __init__(self, foo="bar", pickle_me=(lambda x: x + 1)):
            super().__init__()
            self.save_hyperparameters()

    model = Unpicklable()
    trainer = Trainer(default_root_dir=tmp_path, max_steps=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False)
    with pytest.warns(UserWarning, match="Attribute 'pickle_me' removed from hparams because it cannot be pickled"):
        trainer.fit(model)
    assert "pickle_me" not in model.hparams and model.hparams.foo == "bar"


def test_enum_hparams_are_saved_by_name(tmp_path):
    class Options(str, Enum):
        first = "first_value"

    path = tmp_path / "hparams.yaml"
    save_hparams_to_yaml(path, {"switch": Options.first, "n": {"a": 1}})
    assert load_hparams_from_yaml(path, use_omegaconf=False) == {"switch": "first", "n": {"a": 1}}


def test_entry_points_and_load_from_checkpoint_take_weights_only(tmp_path):
    trainer = Trainer(default_root_dir=tmp_path, max_steps=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False)
    model = BoringModel()
    trainer.fit(model, weights_only=False)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    loaded = BoringModel.load_from_checkpoint(path, weights_only=True)
    assert torch.equal(loaded.layer.weight, model.layer.weight)
    trainer.validate(model, verbose=False, weights_only=None)
