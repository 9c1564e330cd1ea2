"""save_hyperparameters, hparams, AttributeDict and load_from_checkpoint behave as Lightning 2.6's."""

from __future__ import annotations

import dataclasses
from argparse import Namespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.trainer.utilities.parsing import AttributeDict

pl = pytest.importorskip("lightning.pytorch")


def _both(build):
    """The same class body built on gpulayer's and on Lightning's base classes."""
    return build(gl.LightningModule), build(pl.LightningModule)


def _hparams_of(build, *args, **kwargs):
    ours, theirs = _both(build)
    a, b = ours(*args, **kwargs), theirs(*args, **kwargs)
    return (dict(a.hparams), getattr(a, "_hparams_name", None)), (dict(b.hparams), getattr(b, "_hparams_name", None))


def test_save_hyperparameters_stores_what_lightning_stores_for_each_way_of_calling_it():
    def all_args(base):
        class M(base):
            def __init__(self, a=1, b="x", *args, c=None, **kwargs):
                super().__init__()
                self.save_hyperparameters(ignore=["c"])
        return M

    def named(base):
        class M(base):
            def __init__(self, a=1, b=2, c=3):
                super().__init__()
                self.save_hyperparameters("a", "c")
        return M

    def one_dict(base):
        class M(base):
            def __init__(self, config):
                super().__init__()
                self.save_hyperparameters(config)
        return M

    def inherited(base):
        class Parent(base):
            def __init__(self, a=1, b=2, **kwargs):
                super().__init__()
                self.save_hyperparameters()

        class Child(Parent):
            def __init__(self, c=3, a=10):
                super().__init__(a=a, extra=4)
        return Child

    ours, theirs = _hparams_of(all_args, 5, "y", 7, c=1, d=2)
    assert ours == theirs and ours[0] == {"a": 5, "b": "y", "d": 2}
    assert _hparams_of(named)[0] == _hparams_of(named)[1] == ({"a": 1, "c": 3}, "kwargs")
    for config in ({"lr": 0.1}, Namespace(lr=0.1, layers=2)):
        ours, theirs = _hparams_of(one_dict, config)
        assert ours == theirs and ours[1] == "config"
    ours, theirs = _hparams_of(inherited)
    assert ours == theirs and ours[0] == {"a": 10, "b": 2, "c": 3, "extra": 4}


def test_hparams_initial_keeps_the_saved_values_while_hparams_is_edited():
    class M(gl.LightningModule):
        def __init__(self, lr=0.1):
            super().__init__()
            self.save_hyperparameters()

    m = M()
    m.hparams.lr = 0.5
    assert m.hparams.lr == 0.5 and m.hparams_initial.lr == 0.1 and isinstance(m.hparams_initial, AttributeDict)


def test_a_dataclass_module_saves_its_init_fields():
    @dataclasses.dataclass(eq=False)
    class M(gl.LightningModule):
        lr: float = 0.1
        hidden: int = 4

        def __post_init__(self):
            super().__init__()
            self.save_hyperparameters()

    assert dict(M(lr=0.3).hparams) == {"lr": 0.3, "hidden": 4}


def test_attribute_dict_reads_and_prints_as_lightnings():
    from lightning.pytorch.utilities.parsing import AttributeDict as LightningAttributeDict
    values = {"key1": 1, "a_longer_key": "abc", "my-key": [1, 2]}
    ours = AttributeDict(values)
    ours.new_key = 42
    theirs = LightningAttributeDict(values)
    theirs.new_key = 42
    assert repr(ours) == repr(theirs) and str(ours) == str(theirs) and repr(AttributeDict()) == ""
    assert ours.key1 == 1 and ours["new_key"] == 42
    with pytest.raises(AttributeError):
        _ = ours.missing
    from gpulayer.trainer.utilities import AttributeDict as FromUtilities
    assert FromUtilities is AttributeDict


class _Net(gl.LightningModule):
    def __init__(self, hidden=4, lr=0.1):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, hidden)
        self.loaded_with = None

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def on_load_checkpoint(self, checkpoint):
        self.loaded_with = checkpoint["global_step"]


def _saved(tmp_path):
    model = _Net(hidden=3)
    trainer = gl.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4))
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    return model, path


def test_load_from_checkpoint_builds_from_saved_hparams_with_overrides(tmp_path):
    model, path = _saved(tmp_path)
    loaded = _Net.load_from_checkpoint(path, lr=0.01)
    assert (loaded.hparams.hidden, loaded.hparams.lr, loaded.loaded_with) == (3, 0.01, 2)
    assert torch.equal(loaded.layer.weight, model.layer.weight)
    with pytest.raises(TypeError, match="cannot be called on an instance"):
        model.load_from_checkpoint(path)


def test_load_from_checkpoint_takes_hparams_from_a_yaml_file_and_refuses_other_extensions(tmp_path):
    pytest.importorskip("yaml")
    _, path = _saved(tmp_path)
    from gpulayer.trainer.core.saving import save_hparams_to_yaml
    save_hparams_to_yaml(tmp_path / "hparams.yaml", {"hidden": 3, "lr": 0.7})
    assert _Net.load_from_checkpoint(path, hparams_file=tmp_path / "hparams.yaml").hparams.lr == 0.7
    with pytest.raises(ValueError, match=".csv, .yml or .yaml is required"):
        _Net.load_from_checkpoint(path, hparams_file=tmp_path / "hparams.json")


def test_load_from_checkpoint_strict_false_warns_about_mismatched_keys(tmp_path):
    _, path = _saved(tmp_path)

    class Wider(_Net):
        def __init__(self, hidden=4, lr=0.1):
            super().__init__(hidden, lr)
            self.extra = torch.nn.Linear(1, 1)

    with pytest.raises(RuntimeError, match="Missing key"):
        Wider.load_from_checkpoint(path)
    with pytest.warns(UserWarning, match="in the model state dict but not in the checkpoint"):
        Wider.load_from_checkpoint(path, strict=False)


def test_datamodule_hparams_are_saved_and_load_back(tmp_path):
    class Data(gl.LightningDataModule):
        def __init__(self, batch_size=4):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=self.hparams.batch_size)

    trainer = gl.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(_Net(), datamodule=Data(batch_size=2))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    ckpt = torch.load(tmp_path / "m.ckpt", weights_only=False)
    assert ckpt["datamodule_hyper_parameters"] == {"batch_size": 2} and ckpt["datamodule_hparams_name"] == "kwargs"
    assert Data.load_from_checkpoint(tmp_path / "m.ckpt").hparams.batch_size == 2


def test_datamodule_from_datasets_and_its_string():
    ds = TensorDataset(torch.randn(10, 2))
    dm = gl.LightningDataModule.from_datasets(ds, val_dataset=[ds, ds], batch_size=5)
    assert len(dm.train_dataloader()) == 2 and [len(v) for v in dm.val_dataloader()] == [2, 2]
    assert str(dm).splitlines() == ["{Train dataloader: size=10}", "{Validation dataloader: 1. size=10 ; 2. size=10}",
                                    "{Test dataloader: None}", "{Predict dataloader: None}"]
    with pytest.raises(gl.MisconfigurationException, match="`test_dataloader` must be implemented"):
        dm.test_dataloader()
