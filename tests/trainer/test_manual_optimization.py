"""Manual optimization as Lightning documents it (``automatic_optimization = False``): the user zeroes,
backpropagates with ``manual_backward`` and steps; ``self.optimizers()`` and ``self.lr_schedulers()``;
several optimizers with ``toggle_optimizer``; closures; accumulation; ``clip_gradients``.

Each scenario runs under both Trainers (``twin.both``) and must end with the same weights, bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.trainer.twin import QUIET, both, loader


def weights(module: nn.Module) -> list:
    return [p.detach().flatten().tolist() for p in module.parameters()]


def manual(L, step, optimizers, epochs=2, **trainer):
    """Fit a two-layer module whose training_step is ``step(self, batch, batch_idx)`` under manual optimization."""

    class Manual(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.first, self.second = nn.Linear(4, 3), nn.Linear(3, 1)
            self.record = []

        def forward(self, x):
            return self.second(torch.tanh(self.first(x)))

        def loss(self, batch):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def training_step(self, batch, batch_idx):
            return step(self, batch, batch_idx)

        def configure_optimizers(self):
            return optimizers(self)

    L.seed_everything(11)
    model = Manual()
    trainer = L.Trainer(max_epochs=epochs, enable_checkpointing=False, **QUIET, **trainer)
    trainer.fit(model, loader(rows=24, batch_size=4))
    return weights(model), trainer.global_step, model.record


def test_manual_steps_give_lightnings_weights_and_count_one_global_step_per_optimizer_step():
    def step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.loss(batch)
        self.manual_backward(loss)
        opt.step()
        self.record.append(any(c.__name__ == "LightningOptimizer" for c in type(opt).__mro__))

    def run(L):
        w, steps, record = manual(L, step, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
        return w, steps, set(record)

    w, steps, kinds = both(run)
    assert steps == 12 and kinds == {True}  # self.optimizers() hands out LightningOptimizer wrappers


def test_two_optimizers_each_step_their_own_parameters_and_both_count():
    def step(self, batch, batch_idx):
        first, second = self.optimizers()
        for opt in (first, second):
            self.toggle_optimizer(opt)
            opt.zero_grad()
            self.manual_backward(self.loss(batch))
            opt.step()
            self.untoggle_optimizer(opt)

    def optimizers(m):
        return [torch.optim.SGD(m.first.parameters(), lr=0.1), torch.optim.Adam(m.second.parameters(), lr=0.01)]

    w, steps, _ = both(manual, step, optimizers)
    assert steps == 24  # two optimizer steps per batch, as Lightning counts them


def test_the_user_steps_the_schedulers_from_lr_schedulers():
    def step(self, batch, batch_idx):
        opt, sched = self.optimizers(), self.lr_schedulers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        opt.step()
        if batch_idx == 5:  # the epoch's last batch
            sched.step()
        self.record.append(opt.param_groups[0]["lr"])

    def optimizers(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    w, steps, lrs = both(manual, step, optimizers)
    assert lrs == [0.1] * 5 + [0.05] * 6 + [0.025]  # stepped by the user only, never by the Trainer


def test_accumulating_gradients_by_hand_steps_every_second_batch():
    def step(self, batch, batch_idx):
        opt = self.optimizers()
        self.manual_backward(self.loss(batch) / 2)
        if (batch_idx + 1) % 2 == 0:
            opt.step()
            opt.zero_grad()

    w, steps, _ = both(manual, step, lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    assert steps == 6


def test_clip_gradients_clips_before_the_users_step():
    def step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch) * 100)
        self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        total = torch.norm(torch.stack([p.grad.norm() for p in self.parameters()]))
        self.record.append(round(float(total), 4))
        opt.step()

    w, steps, norms = both(manual, step, lambda m: torch.optim.SGD(m.parameters(), lr=0.01), epochs=1)
    assert max(norms) <= 0.5


def test_a_closure_is_handed_to_the_torch_optimizer():
    def step(self, batch, batch_idx):
        opt = self.optimizers()

        def closure():
            opt.zero_grad()
            loss = self.loss(batch)
            self.manual_backward(loss)
            self.record.append("closure")
            return loss

        opt.step(closure=closure)

    w, steps, calls = both(manual, step, lambda m: torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=3), epochs=1)
    assert steps == 6 and len(calls) > 6  # LBFGS evaluates the closure several times per step
