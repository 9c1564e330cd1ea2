"""A fit keeps the garbage collector off the objects that existed before it, and hands them back."""

from __future__ import annotations

import gc
import weakref

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it


class Probe(Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.frozen_during_fit: list[int] = []
        self.cycles_made_in_fit: list[weakref.ref] = []

    def training_step(self, batch, batch_idx):
        self.frozen_during_fit.append(gc.get_freeze_count())
        self.cycles_made_in_fit.append(weakref.ref(Node()))
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(model: Module) -> None:
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    Trainer(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(
        model, DataLoader(data, batch_size=8))


def test_objects_from_before_the_fit_are_frozen_during_it_and_released_after():
    assert gc.get_freeze_count() == 0
    before = Node()
    model = Probe()
    _fit(model)
    assert model.frozen_during_fit and min(model.frozen_during_fit) > 1000  # the test process's heap, at least
    assert gc.get_freeze_count() == 0  # handed back to the collector
    dead_before = weakref.ref(before)
    del before
    gc.collect()
    assert dead_before() is None


def test_garbage_made_during_the_fit_is_still_collected():
    model = Probe()
    _fit(model)
    gc.collect()
    assert len(model.cycles_made_in_fit) == 4
    assert all(r() is None for r in model.cycles_made_in_fit)


def test_a_heap_the_program_froze_itself_stays_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        _fit(Probe())
        # A frozen object whose last reference goes is still freed, so the count may fall a little (465,340 ->
        # 465,324 seen once); a fit that unfroze the program's heap would drop it to 0.
        assert gc.get_freeze_count() > 0.9 * frozen
    finally:
        gc.unfreeze()
