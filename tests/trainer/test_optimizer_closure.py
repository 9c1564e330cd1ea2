"""Manual optimization: opt.step(closure=...) hands the closure to the torch optimizer (LBFGS), as Lightning."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.trainer.core.optimizer import LightningOptimizer

pl = pytest.importorskip("lightning.pytorch")


def _lbfgs_model(base):
    class Fit(base):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.layer = torch.nn.Linear(3, 1)
            self.closure_calls = 0

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            x, y = batch

            def closure():
                self.closure_calls += 1
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(self.layer(x), y)
                self.manual_backward(loss)
                return loss

            opt.step(closure=closure)

        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=5)

    return Fit


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=g)
    return DataLoader(TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]])), batch_size=16)


def test_lbfgs_calls_the_closure_itself_and_ends_at_lightnings_weights():
    models = {}
    for side, mod in (("gl", gl), ("pl", pl)):
        torch.manual_seed(4)
        model = _lbfgs_model(mod.LightningModule)()
        kw = dict(accelerator="cpu", devices=1) if side == "pl" else {}
        trainer = mod.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                              enable_model_summary=False, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, _data())
        models[side] = (model, trainer)
    ours, theirs = models["gl"][0], models["pl"][0]
    assert ours.closure_calls == theirs.closure_calls > 4  # LBFGS evaluates it several times a step
    assert models["gl"][1].global_step == models["pl"][1].global_step == 4
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_lightning_optimizer_outside_a_fit_passes_the_closure_through():
    p = torch.nn.Parameter(torch.tensor([3.0]))
    opt = LightningOptimizer(torch.optim.LBFGS([p], lr=1.0, max_iter=4))
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = (p - 1).pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure=closure)
    assert len(calls) > 1 and abs(p.item() - 1.0) < 1e-3
