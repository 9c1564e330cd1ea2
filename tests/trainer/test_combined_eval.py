"""A CombinedLoader in a non-sequential mode evaluates as one loader of combined batches (Lightning's rule)."""

from __future__ import annotations

import importlib

import pytest

from tests.trainer.twin import both, needs_lightning


def _combined(L, mode, fn):
    seen = []
    combined = importlib.import_module(f"{L.name}.pytorch" if L.name == "lightning" else "gpulayer.trainer")
    loader_cls = importlib.import_module(f"{combined.__name__}.utilities").CombinedLoader

    class Model(L.LightningModule):
        def validation_step(self, batch, batch_idx, dataloader_idx=None):
            seen.append((batch_idx, batch, dataloader_idx))

        test_step = validation_step

    trainer = L.Trainer(barebones=True)
    getattr(trainer, fn)(Model(), loader_cls({"a": [0, 1, 2], "b": {3, 4}}, mode), verbose=False)
    counts = trainer.num_val_batches if fn == "validate" else trainer.num_test_batches
    return seen, counts, trainer.num_sanity_val_batches


@needs_lightning
@pytest.mark.parametrize("mode", ["max_size_cycle", "min_size", "max_size", "sequential"])
@pytest.mark.parametrize("fn", ["validate", "test"])
def test_modes_give_lightnings_batches_and_counts(mode, fn):
    seen, counts, sanity = both(_combined, mode, fn)
    assert counts == [3, 2] and sanity == []
    if mode == "min_size":
        assert seen == [(0, {"a": 0, "b": 3}, None), (1, {"a": 1, "b": 4}, None)]
    if mode == "sequential":
        assert [s[2] for s in seen] == [0, 0, 0, 1, 1]
