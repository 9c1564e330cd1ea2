"""An overridden ``optimizer_step`` (LR warm-up) on ``devices=2``: the weights lightning 2.6.6 gets.

Two gpulayer ranks with 8 samples each per step equal one lightning process stepping on the
union of those samples (``ddp_order.DDPShardOrder``): plain SGD on a mean loss averages the same.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.trainer.ddp_order import DDPShardOrder

needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None and not os.environ.get("CI"),
    reason="lightning is not installed (the test extras install it; required under CI)")


def _warmup_net(pkg):
    class WarmUp(pkg.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(6, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            scale = min(1.0, (self.trainer.global_step + 1) / 4)  # the first 4 steps ramp the LR up
            for group in optimizer.param_groups:
                group["lr"] = 0.1 * scale
            optimizer.step(closure=optimizer_closure)

    return WarmUp


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g))


@needs_lightning
def test_warmup_optimizer_step_on_two_processes_gives_lightnings_weights():
    import lightning.pytorch as lp

    import gpulayer.trainer as gl

    kw = dict(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False)
    gl.seed_everything(1)
    ours = _warmup_net(gl)()
    trainer = gl.Trainer(devices=2, strategy="ddp", **kw)
    trainer.fit(ours, DataLoader(_dataset(), batch_size=8))
    assert trainer.global_step == 8

    lp.seed_everything(1)
    theirs = _warmup_net(lp)()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lp.Trainer(devices=1, **kw).fit(
            theirs, DataLoader(_dataset(), batch_size=16, sampler=DDPShardOrder(64, 2, 8, seed=1)))
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=f"{name} differs from lightning's")
