"""Where a step is in its epoch, as Lightning exposes it to ``training_step``: ``batch_idx`` and
``trainer.is_last_batch``, under automatic and manual optimization."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.trainer.twin import QUIET, both, loader, regressor


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


def test_is_last_batch_as_callbacks_see_it_around_the_last_batch():
    def run(L):
        class Net(regressor(L)):
            pass

        class Watch(L.Callback):
            def __init__(self):
                self.seen = []

            def on_train_epoch_start(self, trainer, pl_module):
                self.seen.append(("epoch_start", trainer.current_epoch, trainer.is_last_batch))

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                self.seen.append(("start", batch_idx, trainer.is_last_batch))

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.seen.append(("end", batch_idx, trainer.is_last_batch))

            def on_train_epoch_end(self, trainer, pl_module):
                self.seen.append(("epoch_end", trainer.current_epoch, trainer.is_last_batch))

        watch = Watch()
        L.Trainer(max_epochs=2, enable_checkpointing=False, callbacks=[watch], **QUIET).fit(
            Net(), loader(rows=8, batch_size=4))
        return watch.seen

    per_epoch = lambda e, before: [("epoch_start", e, before), ("start", 0, False), ("end", 0, False),  # noqa: E731
                                   ("start", 1, True), ("end", 1, True), ("epoch_end", e, True)]
    # still True at the next epoch's start: it changes with that epoch's first batch
    assert both(run) == per_epoch(0, False) + per_epoch(1, True)
