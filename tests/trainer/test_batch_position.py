"""Where a step is in its epoch, as Lightning exposes it to ``training_step``: ``batch_idx`` and
``trainer.is_last_batch``, under automatic and manual optimization."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.trainer.twin import QUIET, both, loader


def positions(L, automatic):
    class Where(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = automatic
            self.layer = nn.Linear(4, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            self.seen.append((self.current_epoch, batch_idx, self.trainer.is_last_batch))
            loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            if automatic:
                return loss
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Where()
    L.Trainer(max_epochs=2, enable_checkpointing=False, **QUIET).fit(model, loader(rows=12, batch_size=4))
    return model.seen


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_is_last_batch_is_true_in_each_epochs_last_training_step(automatic):
    seen = both(positions, automatic)
    assert seen == [(e, b, b == 2) for e in range(2) for b in range(3)]
