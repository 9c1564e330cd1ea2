"""Lightning's own tests, copied verbatim with only the imports changed.

From github.com/Lightning-AI/pytorch-lightning, tests/tests_pytorch/core/test_datamodules.py at 7f0c3436cd3f
(the 2.6 line; compared against the installed Lightning 2.6.6). Imports: ``lightning.pytorch`` ->
``gpulayer.trainer``; ``tests_pytorch.helpers.runif`` -> ``tests.trainer.lightning_suite.runif``.
Only the functions that run on gpulayer are kept (5 here); the others are counted in
tests/trainer/lightning_suite/README.md.
"""

import os
import pickle
from argparse import Namespace
from dataclasses import dataclass
from typing import Any
from unittest import mock
from unittest.mock import Mock, PropertyMock, call
import pytest
import torch
from gpulayer.trainer import LightningDataModule, Trainer, seed_everything
from gpulayer.trainer.callbacks import ModelCheckpoint
from gpulayer.trainer.demos.boring_classes import (
    BoringDataModule,
    BoringDataModuleNoLen,
    BoringModel,
    IterableBoringDataModule,
)
from gpulayer.trainer.utilities.exceptions import MisconfigurationException
from gpulayer.trainer.utilities.imports import _OMEGACONF_AVAILABLE
from tests.trainer.lightning_suite.runif import RunIf


if _OMEGACONF_AVAILABLE:
    from omegaconf import OmegaConf


def test_hooks_no_recursion_error():
    # hooks were appended in cascade every tine a new data module was instantiated leading to a recursion error.
    # See https://github.com/Lightning-AI/pytorch-lightning/issues/3652
    class DummyDM(LightningDataModule):
        def setup(self, *args, **kwargs):
            pass

        def prepare_data(self, *args, **kwargs):
            pass

    for i in range(1005):
        dm = DummyDM()
        dm.setup()
        dm.prepare_data()


def test_helper_boringdatamodule():
    dm = BoringDataModule()
    dm.prepare_data()
    dm.setup("fit")


def test_helper_boringdatamodule_with_verbose_setup():
    dm = BoringDataModule()
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")


class DataDirDataModule(BoringDataModule):
    def __init__(self, data_dir: str):
        super().__init__()
        self.data_dir = data_dir


def test_dm_pickle_after_init():
    dm = BoringDataModule()
    pickle.dumps(dm)


class DummyDS(torch.utils.data.Dataset):
    def __getitem__(self, index):
        return 1

    def __len__(self):
        return 100


class DummyIDS(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield 1


class DataModuleWithHparams_0(LightningDataModule):
    def __init__(self, arg0, arg1, kwarg0=None):
        super().__init__()
        self.save_hyperparameters()


class DataModuleWithHparams_1(LightningDataModule):
    def __init__(self, arg0, *args, **kwargs):
        super().__init__()
        self.save_hyperparameters(arg0)


def test_define_as_dataclass():
    class BoringDataModule(LightningDataModule):
        def __init__(self, foo=None):
            super().__init__()

    # makes sure that no functionality is broken and the user can still manually make
    # super().__init__ call with parameters
    # also tests all the dataclass features that can be enabled without breaking anything
    @dataclass(init=True, repr=True, eq=True, order=True, unsafe_hash=True, frozen=False)
    class BoringDataModule1(BoringDataModule):
        batch_size: int
        foo: int = 2

        def __post_init__(self):
            super().__init__(foo=self.foo)

    # asserts for the different dunder methods added by dataclass, when __init__ is implemented, i.e.
    # __repr__, __eq__, __lt__, __le__, etc.
    assert BoringDataModule1(batch_size=64).foo == 2
    assert BoringDataModule1(batch_size=32)
    assert hasattr(BoringDataModule1, "__repr__")
    assert BoringDataModule1(batch_size=32) == BoringDataModule1(batch_size=32)

    # asserts inherent calling of super().__init__ in case user doesn't make the call
    @dataclass
    class BoringDataModule2(LightningDataModule):
        batch_size: int

    # asserts for the different dunder methods added by dataclass, when super class is inherently initialized, i.e.
    # __init__, __repr__, __eq__, __lt__, __le__, etc.
    assert BoringDataModule2(batch_size=32)
    assert hasattr(BoringDataModule2, "__repr__")
    assert BoringDataModule2(batch_size=32).prepare_data() is None
    assert BoringDataModule2(batch_size=32) == BoringDataModule2(batch_size=32)
