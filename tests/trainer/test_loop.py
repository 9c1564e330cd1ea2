"""The fit loop against a hand-written PyTorch loop: same seed, same losses."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Callback, Module, Trainer, seed_everything


class MLP(Module):
    def __init__(self, clip: bool = False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())  # Lightning hands {"loss": ...} to the hook

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _data(n: int = 640) -> TensorDataset:
    g = torch.Generator().manual_seed(123)
    return TensorDataset(torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g))


def _quiet(**kw) -> Trainer:
    return Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **kw)


def _raw_losses(steps: int, clip: float | None = None, accumulate: int = 1) -> list[float]:
    seed_everything(7)
    model = MLP()
    opt = model.configure_optimizers()
    loader = DataLoader(_data(), batch_size=32, shuffle=True)
    losses, step = [], 0
    while step < steps:
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model.net(x), y)
            losses.append(loss.item())
            (loss / accumulate).backward()
            if (i + 1) % accumulate == 0 or i + 1 == len(loader):
                if clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if step == steps:
                    break
    return losses


def _trainer_losses(steps: int, **kw) -> list[float]:
    seed_everything(7)
    model = MLP()
    _quiet(max_steps=steps, **kw).fit(model, DataLoader(_data(), batch_size=32, shuffle=True))
    return model.losses


def test_fifty_steps_match_a_raw_pytorch_loop():
    # 50 steps cross an epoch boundary (20 batches per epoch): reshuffles must match too
    assert _trainer_losses(50) == _raw_losses(50)


def test_clipping_and_accumulation_match_the_raw_loop():
    raw = _raw_losses(12, clip=0.5, accumulate=3)
    # on_train_batch_end sees the loss divided by the accumulation, as in Lightning
    ours = [loss * 3 for loss in _trainer_losses(12, gradient_clip_val=0.5, accumulate_grad_batches=3)]
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(raw), rtol=1e-6, atol=1e-7)


def test_bf16_mixed_runs_on_cpu_and_autocasts():
    seen = {}

    class Probe(MLP):
        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self.net(x)
            seen["dtype"] = out.dtype
            return nn.functional.mse_loss(out.float(), y)

    model = Probe()
    trainer = _quiet(max_steps=5, precision="bf16-mixed", accelerator="cpu")
    trainer.fit(model, DataLoader(_data(), batch_size=32))
    assert seen["dtype"] == torch.bfloat16
    assert trainer.global_step == 5
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_log_values_reach_callback_metrics_and_progress_at_intervals():
    class Watch(Callback):
        def __init__(self):
            self.types = set()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.types.add(type(trainer.callback_metrics["train_loss"]))

    watch = Watch()
    model = MLP()
    trainer = Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      callbacks=[watch])
    trainer.fit(model, DataLoader(_data(), batch_size=32))
    assert watch.types == {torch.Tensor}  # tensors, no .item() per step
    assert trainer.global_step == 40 and trainer.current_epoch == 2
    assert float(trainer.callback_metrics["train_loss"]) == model.losses[-1]


def test_epoch_means_are_weighted_by_batch_size():
    class Val(MLP):
        def validation_step(self, batch, batch_idx):
            self.log("val_n", float(batch[0].shape[0]), reduce_fx="sum")
            self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    model = Val()
    trainer = _quiet(max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(_data(), batch_size=32), DataLoader(_data(100), batch_size=64))
    assert float(trainer.callback_metrics["val_n"]) == 100.0
    model.eval()
    with torch.no_grad():
        x, y = _data(100).tensors
        expected = nn.functional.mse_loss(model.net(x), y)
    torch.testing.assert_close(trainer.callback_metrics["val_loss"], expected)


def test_only_overridden_hooks_are_dispatched():
    model = MLP()
    trainer = _quiet(max_steps=1)
    trainer.fit(model, DataLoader(_data(), batch_size=32))
    hooks = trainer.hooks
    assert hooks.on_after_backward == [] and hooks.on_before_optimizer_step == []
    assert len(hooks.on_train_batch_end) == 1  # the module's own


def test_module_loaders_and_epoch_hooks_run_in_lightning_order():
    calls = []

    class Hooked(MLP):
        def train_dataloader(self):
            return DataLoader(_data(64), batch_size=32)

        def val_dataloader(self):
            return DataLoader(_data(64), batch_size=32)

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def on_train_start(self):
            calls.append("train_start")

        def on_train_epoch_start(self):
            calls.append(f"epoch_start{self.current_epoch}")

        def on_validation_epoch_end(self):
            calls.append("val_end")

        def on_train_epoch_end(self):
            calls.append(f"epoch_end{self.current_epoch}@{self.global_step}")

        def on_train_end(self):
            calls.append("train_end")

    _quiet(max_epochs=2, num_sanity_val_steps=0).fit(Hooked())
    assert calls == ["train_start", "epoch_start0", "val_end", "epoch_end0@2", "epoch_start1", "val_end",
                     "epoch_end1@4", "train_end"]


def test_limits_and_val_check_interval():
    class Count(MLP):
        val_batches = 0

        def validation_step(self, batch, batch_idx):
            Count.val_batches += 1

    trainer = _quiet(max_epochs=1, limit_train_batches=0.5, limit_val_batches=2, val_check_interval=5,
                     num_sanity_val_steps=0)
    trainer.fit(Count(), DataLoader(_data(), batch_size=32), DataLoader(_data(), batch_size=32))
    assert trainer.global_step == 10
    assert Count.val_batches == 4  # after batch 5 and at the epoch end (batch 10), two batches each
