"""The Trainer part of ``gpulayer demo``: one small fit on one process, then on two.

>>> from gpulayer.trainer.demo import run_training_demo
>>> result = run_training_demo(print)   # doctest: +SKIP
"""

from __future__ import annotations

import tempfile
import time
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer.callbacks import Callback
from gpulayer.trainer.module import Module
from gpulayer.trainer.seed import seed_everything
from gpulayer.trainer.trainer import Trainer


class DemoRegressor(Module):
    """A two-layer MLP learning a noisy linear function."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def demo_loader(batch_size: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 32, generator=g)
    y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(2048, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)


class EpochLosses(Callback):
    """Collects the epoch-mean training loss; its state comes back from rank 0 after a DDP fit."""

    def __init__(self):
        self.losses: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.losses.append(float(trainer.callback_metrics["train_loss"]))

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.losses = list(state_dict["losses"])


def run_training_demo(console_print: Callable[[str], Any] = print, epochs: int = 3) -> dict[str, Any]:
    """Train the demo model on 1 process and on 2 (DDP on CPU); print and return the epoch losses.

    With two processes each takes half of every batch, so both runs follow nearly the same losses.
    """
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpulayer-demo-") as root:
        for devices in (1, 2):
            seed_everything(0)
            model, record = DemoRegressor(), EpochLosses()
            trainer = Trainer(max_epochs=epochs, devices=devices, accelerator="cpu", logger=False, callbacks=[record],
                              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                              default_root_dir=root)
            start = time.perf_counter()
            trainer.fit(model, demo_loader(batch_size=64 // devices))
            seconds = time.perf_counter() - start
            label = "1 process" if devices == 1 else f"{devices} processes (DDP over gloo)"
            shown = ", ".join(f"{v:.4f}" for v in record.losses)
            console_print(f"Trainer on {label}: {trainer.global_step} steps in {seconds:.1f} s; epoch losses {shown}")
            results[f"devices={devices}"] = {"losses": record.losses, "steps": trainer.global_step, "seconds": seconds}
    return results


if __name__ == "__main__":
    run_training_demo()
