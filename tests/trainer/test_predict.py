"""``Trainer.predict`` as Lightning documents it: what it returns for one loader, several, dict outputs,
``return_predictions=False``, in which mode the model runs, and prediction writers.

Each scenario runs under both Trainers (``twin.both``); the expected values are pinned too.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.trainer.twin import QUIET, both, loader


def predictor(L, output="tensor"):
    class Predictor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 2)
            self.seen = []

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            self.seen.append((self.training, torch.is_grad_enabled(), dataloader_idx, batch_idx))
            out = self.layer(batch[0])
            return {"y": out, "batch": batch_idx} if output == "dict" else out

    return Predictor()


def shapes(result):
    if isinstance(result, torch.Tensor):
        return tuple(result.shape)
    if isinstance(result, dict):
        return {k: shapes(v) for k, v in result.items()}
    if isinstance(result, list):
        return [shapes(r) for r in result]
    return result


def test_predict_returns_one_output_per_batch():
    def run(L):
        torch.manual_seed(0)
        model = predictor(L)
        out = L.Trainer(**QUIET).predict(model, loader(rows=10, batch_size=4))
        return shapes(out), model.seen

    out, seen = both(run)
    assert out == [(4, 2), (4, 2), (2, 2)]
    assert seen == [(False, False, 0, 0), (False, False, 0, 1), (False, False, 0, 2)]  # eval mode, no grad


def test_predict_with_several_loaders_returns_a_list_per_loader():
    def run(L):
        model = predictor(L)
        out = L.Trainer(**QUIET).predict(model, [loader(rows=8, batch_size=4), loader(rows=6, batch_size=6, seed=1)])
        return shapes(out), [s[2:] for s in model.seen]

    out, seen = both(run)
    assert out == [[(4, 2), (4, 2)], [(6, 2)]]
    assert seen == [(0, 0), (0, 1), (1, 0)]


def test_predict_keeps_dict_outputs_as_returned():
    out = both(lambda L: shapes(L.Trainer(**QUIET).predict(predictor(L, "dict"), loader(rows=8, batch_size=4))))
    assert out == [{"y": (4, 2), "batch": 0}, {"y": (4, 2), "batch": 1}]


def test_predict_without_return_predictions_returns_none_but_runs_every_batch():
    def run(L):
        model = predictor(L)
        out = L.Trainer(**QUIET).predict(model, loader(rows=12, batch_size=4), return_predictions=False)
        return out, len(model.seen)

    assert both(run) == (None, 3)


def test_predict_honours_limit_predict_batches():
    out = both(lambda L: shapes(L.Trainer(limit_predict_batches=2, **QUIET).predict(predictor(L), loader(rows=16))))
    assert out == [(4, 2), (4, 2)]


def test_predict_gives_the_same_values_as_calling_the_model():
    def run(L):
        torch.manual_seed(3)
        model = predictor(L)
        data = loader(rows=8, batch_size=8)
        predicted = L.Trainer(**QUIET).predict(model, data)[0]
        with torch.no_grad():
            direct = model.layer(next(iter(data))[0])
        return torch.equal(predicted, direct), predicted.requires_grad

    assert both(run) == (True, False)


def test_a_prediction_writer_gets_every_batch_and_the_epoch():
    def run(L):
        class Writer(L.BasePredictionWriter):
            def __init__(self):
                super().__init__(write_interval="batch_and_epoch")
                self.batches, self.epoch = [], None

            def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                                   dataloader_idx):
                self.batches.append((batch_idx, tuple(prediction.shape), list(batch_indices)))

            def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
                self.epoch = (shapes(predictions), batch_indices)

        writer = Writer()
        L.Trainer(callbacks=[writer], **QUIET).predict(predictor(L), loader(rows=6, batch_size=4))
        return writer.batches, writer.epoch

    batches, epoch = both(run)
    assert batches == [(0, (4, 2), [0, 1, 2, 3]), (1, (2, 2), [4, 5])]
    assert epoch == ([(4, 2), (2, 2)], [[[0, 1, 2, 3], [4, 5]]])  # as Lightning 2.6.6 passes them for one loader


def test_an_epoch_writer_gets_every_prediction_even_when_predict_returns_none():
    def run(L):
        class Writer(L.BasePredictionWriter):
            def __init__(self):
                super().__init__(write_interval="epoch")
                self.written = None

            def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
                self.written = (shapes(predictions), batch_indices)

        writer = Writer()
        out = L.Trainer(callbacks=[writer], **QUIET).predict(
            predictor(L), [loader(rows=4, batch_size=2), loader(rows=3, batch_size=3, seed=1)], return_predictions=False)
        return out, writer.written

    out, written = both(run)
    assert out is None
    assert written == ([[(2, 2), (2, 2)], [(3, 2)]], [[[0, 1], [2, 3]], [[0, 1, 2]]])


def test_a_batch_writer_is_not_called_at_the_epoch_end_and_gets_the_loader_index():
    def run(L):
        class Writer(L.BasePredictionWriter):
            def __init__(self):
                super().__init__()  # "batch" by default
                self.calls = []

            def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                                   dataloader_idx):
                self.calls.append((dataloader_idx, batch_idx, list(batch_indices)))

        writer = Writer()
        out = L.Trainer(callbacks=[writer], **QUIET).predict(
            predictor(L), [loader(rows=4, batch_size=4), loader(rows=2, batch_size=1, seed=1)])
        return shapes(out), writer.calls

    out, calls = both(run)
    assert out == [[(4, 2)], [(1, 2), (1, 2)]]
    assert calls == [(0, 0, [0, 1, 2, 3]), (1, 0, [0]), (1, 1, [1])]


def test_a_writer_refuses_an_unknown_write_interval():
    def run(L):
        try:
            L.BasePredictionWriter(write_interval="sometimes")
        except Exception as err:
            return type(err).__name__, str(err)

    assert both(run) == ("MisconfigurationException",
                         "`write_interval` should be one of ['batch', 'epoch', 'batch_and_epoch'].")
