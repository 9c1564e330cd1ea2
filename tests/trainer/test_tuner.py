"""``Tuner``: the learning-rate range test and the batch-size search, against Lightning where they must agree."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.utils.data import DataLoader

from gpulayer.trainer import Trainer
from gpulayer.trainer.demos.boring_classes import BoringModel, RandomDataset
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.tuner import Tuner
from gpulayer.trainer.tuner.batch_size_scaling import BatchSizeProbe, search_batch_size
from gpulayer.trainer.tuner.lr_finder import LRFinder, lr_schedule
from tests.trainer.twin import both, needs_lightning

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _tunable(base, fits_up_to: int | None = None):
    class Tunable(base):
        def __init__(self):
            super().__init__()
            self.lr, self.batch_size = 0.1, 2

        def training_step(self, batch, batch_idx):
            if fits_up_to is not None and len(batch) > fits_up_to:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")  # what an OOM looks like
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)

    return Tunable()


def _scaled(L, mode, fits_up_to):
    root = "lightning.pytorch" if L.name == "lightning" else "gpulayer.trainer"
    tuner_cls = importlib.import_module(f"{root}.tuner").Tuner
    demos = importlib.import_module(f"{root}.demos.boring_classes")
    model = _tunable(demos.BoringModel, fits_up_to)
    found = tuner_cls(L.Trainer(max_epochs=1, **QUIET)).scale_batch_size(model, mode=mode, max_trials=10)
    return found, model.batch_size


@needs_lightning
@pytest.mark.parametrize("mode", ["power", "binsearch"])
@pytest.mark.parametrize("fits_up_to", [None, 8, 11])
def test_batch_size_search_finds_what_lightning_finds(mode, fits_up_to):
    found, kept = both(_scaled, mode, fits_up_to)
    assert found == kept


def _probe(fits_up_to: int | None, dataset_length: float | None = None, error: str = "CUDA out of memory."):
    held = {"size": 2, "tried": []}

    def trial(size):
        held["tried"].append(size)
        if fits_up_to is None or size > fits_up_to:
            raise RuntimeError(error)

    probe = BatchSizeProbe(trial=trial, current=lambda: held["size"], put=lambda s: held.update(size=s),
                           dataset_length=lambda: dataset_length)
    return probe, held


def test_search_is_pure_and_bisects_after_the_first_failure():
    probe, held = _probe(fits_up_to=100)
    found = search_batch_size(probe, "binsearch", 2, 25, 0.0, 8192)
    # doubles until 128 fails, then bisects between the largest success and the smallest failure
    assert found == 100 and held["tried"][:7] == [2, 4, 8, 16, 32, 64, 128] and held["size"] == 100
    probe, held = _probe(fits_up_to=100)
    assert search_batch_size(probe, "power", 2, 25, 0.0, 8192) == 64  # power: halves back after the failure
    probe, _ = _probe(fits_up_to=None, error="not memory")
    with pytest.raises(RuntimeError, match="not memory"):
        search_batch_size(probe, "power", 2, 5, 0.0, 64)


def test_search_stops_at_the_dataset_length_max_val_and_max_trials():
    probe, held = _probe(fits_up_to=10_000, dataset_length=64)
    assert search_batch_size(probe, "power", 8, 25, 0.0, 8192) == 64 and held["tried"] == [8, 16, 32, 64]
    probe, held = _probe(fits_up_to=10_000)
    assert search_batch_size(probe, "power", 2, 25, 0.0, 8) == 8 and held["tried"] == [2, 4]
    probe, held = _probe(fits_up_to=10_000)
    # power counts every trial; binsearch counts successes and takes the margin off (int(8 * 0.95) = 7)
    assert search_batch_size(probe, "power", 2, 3, 0.0, 8192) == 8 and held["tried"] == [2, 4, 8]
    probe, held = _probe(fits_up_to=10_000)
    assert search_batch_size(probe, "binsearch", 2, 3, 0.05, 8192) == 7 and held["size"] == 7


def test_lr_find_restores_weights_sets_the_suggestion_and_records_every_step():
    model = _tunable(BoringModel)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    finder = Tuner(Trainer(max_epochs=3, **QUIET)).lr_find(model, num_training=40, early_stop_threshold=None)
    assert isinstance(finder, LRFinder)
    assert len(finder.results["lr"]) == len(finder.results["loss"]) == 40
    assert finder.results["lr"][0] == pytest.approx(1e-8) and finder.results["lr"][-1] == pytest.approx(1.0)
    assert model.lr == finder.suggestion() and 1e-8 <= model.lr <= 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_lr_find_stops_when_the_loss_diverges():
    model = _tunable(BoringModel)
    finder = Tuner(Trainer(max_epochs=10, **QUIET)).lr_find(model, min_lr=1e-2, max_lr=1e6, num_training=100)
    assert 1 < len(finder.results["loss"]) < 100


def test_lr_find_needs_a_learning_rate_attribute_and_one_optimizer():
    with pytest.raises(AttributeError, match="should have one of these fields: \\('lr', 'learning_rate'\\)"):
        Tuner(Trainer(**QUIET)).lr_find(BoringModel())

    class TwoOptimizers(BoringModel):
        lr = 0.1

        def __init__(self):
            super().__init__()
            self.automatic_optimization = False  # several optimizers need it

        def configure_optimizers(self):
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]

    with pytest.raises(MisconfigurationException, match="only works with single optimizer"):
        Tuner(Trainer(max_epochs=1, **QUIET)).lr_find(TwoOptimizers(), num_training=3)


def test_scale_batch_size_refuses_loaders_passed_directly_and_missing_fields():
    tuner = Tuner(Trainer(**QUIET))
    with pytest.raises(MisconfigurationException, match="dataloaders passed directly"):
        tuner.scale_batch_size(_tunable(BoringModel), train_dataloaders=DataLoader(RandomDataset(32, 4)))
    with pytest.raises(MisconfigurationException, match="Field batch_size not found"):
        tuner.scale_batch_size(BoringModel())


def test_fast_dev_run_skips_both_searches():
    tuner = Tuner(Trainer(fast_dev_run=True, **QUIET))
    with pytest.warns(UserWarning, match="Skipping learning rate finder since `fast_dev_run` is enabled."):
        assert tuner.lr_find(_tunable(BoringModel)) is None
    with pytest.warns(UserWarning, match="Skipping batch size scaler since `fast_dev_run` is enabled."):
        assert tuner.scale_batch_size(_tunable(BoringModel)) is None


def test_schedules_span_the_range():
    assert lr_schedule("linear", 0.0, 1.0, 5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    exp = lr_schedule("exponential", 1e-4, 1.0, 5)
    assert exp[0] == pytest.approx(1e-4) and exp[2] == pytest.approx(1e-2) and exp[-1] == pytest.approx(1.0)
