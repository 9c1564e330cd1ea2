"""Lightning's checks on the loaders a run sets up (``utilities.data``) and on the data arguments of the Trainer:
an ``IterableDataset`` that declares a length, empty loaders, fewer batches than the logging interval,
``fast_dev_run`` and ``reload_dataloaders_every_n_epochs`` values. Compared with Lightning where it runs."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from gpulayer.trainer import Trainer
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.utilities.data import has_iterable_dataset, has_len, has_len_all_ranks, sized_len
from tests.trainer.twin import QUIET, both, loader


class Numbers(IterableDataset):
    def __init__(self, n, with_len):
        self.n, self.with_len = n, with_len

    def __iter__(self):
        return iter([torch.randn(4) for _ in range(self.n)])

    def __len__(self):
        if not self.with_len:
            raise TypeError("no len")
        return self.n


def test_has_len_all_ranks_tells_sized_loaders_and_warns_about_iterable_lengths():
    strategy = Trainer(**QUIET).strategy
    with pytest.warns(UserWarning, match="Your `IterableDataset` has `__len__` defined"):
        assert has_len_all_ranks(DataLoader(Numbers(8, with_len=True), batch_size=4), strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not has_len_all_ranks(DataLoader(Numbers(8, with_len=False), batch_size=4), strategy)
        assert has_len_all_ranks(loader(rows=8), strategy)
    assert has_iterable_dataset(DataLoader(Numbers(8, with_len=False))) and not has_iterable_dataset(loader())
    assert sized_len(loader(rows=8, batch_size=4)) == 2 and sized_len(DataLoader(Numbers(8, False))) is None


def test_an_empty_loader_is_reported():
    empty = DataLoader(torch.zeros(0, 4))
    with pytest.warns(UserWarning, match="Total length of `DataLoader` across ranks is zero"):
        assert has_len_all_ranks(empty, Trainer(**QUIET).strategy)
    with pytest.warns(UserWarning, match="`DataLoader` returned 0 length"):
        assert has_len(empty)


def _messages(caught):
    return sorted({str(w.message) for w in caught if "IterableDataset" in str(w.message)
                   or "logging interval" in str(w.message)})


def test_every_stage_warns_about_an_iterable_dataset_with_a_length():
    def run(L):
        class Net(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)

            def forward(self, x):
                return self.layer(x)

            def training_step(self, batch, batch_idx):
                return self(batch).sum()

            def validation_step(self, batch, batch_idx):
                self.log("v", self(batch).sum())

            test_step = validation_step

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        data = DataLoader(Numbers(8, with_len=True), batch_size=4)
        trainer = L.Trainer(max_steps=2, enable_checkpointing=False, **QUIET)
        seen = []
        for call in (lambda: trainer.fit(Net(), data, data), lambda: trainer.validate(Net(), data),
                     lambda: trainer.test(Net(), data), lambda: trainer.predict(Net(), data)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                call()
            seen.append(len([w for w in caught if "Your `IterableDataset` has `__len__`" in str(w.message)]) > 0)
        return seen

    assert both(run) == [True, True, True, True]


@pytest.mark.parametrize(("log_every", "limit", "warned"), [(2, 1, True), (11, None, True), (5, None, False)])
def test_fewer_batches_than_the_logging_interval_is_a_possible_user_warning(tmp_path, log_every, limit, warned):
    def run(L):
        class Net(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        kw = {**QUIET, "logger": L.CSVLogger(tmp_path / L.name)}
        trainer = L.Trainer(max_epochs=1, log_every_n_steps=log_every, limit_train_batches=limit,
                            enable_checkpointing=False, **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(Net(), loader(rows=10, batch_size=1))
        found = [w for w in caught if "logging interval" in str(w.message)]
        return [(type(w.message).__name__, str(w.message)) for w in found]

    out = both_with_csv(run)
    if warned:
        n = 1 if limit == 1 else 10
        assert out == [("PossibleUserWarning", f"The number of training batches ({n}) is smaller than the logging "
                        f"interval Trainer(log_every_n_steps={log_every}). Set a lower value for log_every_n_steps if "
                        "you want to see logs for the training epoch.")]
    else:
        assert out == []


def both_with_csv(scenario):
    """``both``, with each package's CSVLogger on its namespace."""
    import importlib

    def with_logger(L):
        root = {"gpulayer": "gpulayer.trainer", "lightning": "lightning.pytorch"}[L.name]
        L.CSVLogger = importlib.import_module(f"{root}.loggers").CSVLogger
        return scenario(L)

    return both(with_logger)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"fast_dev_run": -1}, "fast_dev_run=-1 is not a valid configuration. It should be >= 0."),
    ({"reload_dataloaders_every_n_epochs": -1}, "`reload_dataloaders_every_n_epochs` should be an int >= 0, got -1."),
    ({"reload_dataloaders_every_n_epochs": "x"}, "`reload_dataloaders_every_n_epochs` should be an int >= 0, got x."),
])
def test_data_arguments_are_refused_with_lightnings_messages(kwargs, message):
    def run(L):
        try:
            L.Trainer(**QUIET, **kwargs)
        except Exception as err:
            return str(err)
        return None

    assert both(run) == message
    with pytest.raises(MisconfigurationException):
        Trainer(**kwargs)


def test_fast_dev_run_counts_batches_as_given():
    def run(L):
        t = L.Trainer(fast_dev_run=3, **QUIET)
        return t.fast_dev_run, t.limit_train_batches, t.limit_val_batches, t.num_sanity_val_steps, t.max_epochs

    assert both(run) == (3, 3, 3, 0, 1)
