"""A module, a callback and a datamodule that record every hook call, built against either package.

``build(pkg)`` takes ``gpulayer.trainer`` or ``lightning.pytorch`` and returns classes whose
instances append ``(name, detail)`` to a shared list: the same code runs under both
Trainers, so a test compares the two lists. Hooks are wrapped on the instance (as a
user's ``model.hook = fn`` would be), which also checks that instance attributes are honoured.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

MODULE_HOOKS = (
    "configure_callbacks", "prepare_data", "setup", "teardown", "configure_model", "configure_optimizers",
    "on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_train_batch_start", "on_train_batch_end", "training_step", "validation_step", "test_step", "predict_step",
    "on_validation_start", "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_start", "on_test_end", "on_test_epoch_start",
    "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end", "on_predict_start", "on_predict_end",
    "on_predict_epoch_start", "on_predict_epoch_end", "on_predict_batch_start", "on_predict_batch_end",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "on_before_zero_grad",
    "optimizer_zero_grad", "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step",
    "configure_gradient_clipping", "clip_gradients", "optimizer_step", "lr_scheduler_step", "manual_backward",
    "on_validation_model_eval", "on_validation_model_train", "on_validation_model_zero_grad", "on_test_model_eval",
    "on_test_model_train", "on_predict_model_eval", "train_dataloader", "val_dataloader", "test_dataloader",
    "predict_dataloader", "zero_grad", "train", "forward",
)
CALLBACK_HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
    "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start", "on_test_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end", "on_predict_start",
    "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end", "on_predict_batch_start",
    "on_predict_batch_end", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_before_zero_grad",
)
DATAMODULE_HOOKS = ("prepare_data", "setup", "teardown", "train_dataloader", "val_dataloader", "test_dataloader",
                    "predict_dataloader", "on_before_batch_transfer", "transfer_batch_to_device",
                    "on_after_batch_transfer")


class Points(Dataset):
    """``n`` fixed random points of ``dim`` features (drawn from a private generator: no global RNG used)."""

    def __init__(self, n: int = 8, dim: int = 4, seed: int = 0):
        self.x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


def _detail(name: str, args: tuple, kwargs: dict) -> Any:
    """What a record keeps besides the name: ints (indices, epochs), strings (stages), booleans (train mode)."""
    plain = lambda v: getattr(v, "value", v)  # noqa: E731  (Lightning's stages are str enums)
    keep = [plain(a) for a in args if isinstance(a, (bool, int, str))]
    keep += [f"{k}={plain(v)}" for k, v in sorted(kwargs.items()) if isinstance(v, (bool, int, str)) or v is None]
    return tuple(keep)


def _wrap(obj: Any, names: tuple, prefix: str, calls: list) -> None:
    for name in names:
        fn = getattr(obj, name, None)
        if fn is None:
            continue

        def record(*args: Any, __name=name, __fn=fn, **kwargs: Any) -> Any:
            calls.append((prefix + __name, _detail(__name, args, kwargs)))
            return __fn(*args, **kwargs)

        functools.update_wrapper(record, fn)
        object.__setattr__(obj, name, record)


def build(pkg: Any, calls: list, automatic: bool = True, datamodule_transfer: bool = False):
    """(module, callback, datamodule) recording into ``calls``; ``pkg`` is the Lightning-like package."""

    class Net(pkg.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)
            self.automatic_optimization = automatic

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
            loss = self(batch).pow(2).mean()
            if not self.automatic_optimization:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            return loss

        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
            return {"x": self(batch).sum()}

        def test_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
            return {"y": self(batch).sum()}

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]

        def train_dataloader(self) -> DataLoader:
            return DataLoader(Points(8), batch_size=2)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(Points(4, seed=1), batch_size=2)

        def test_dataloader(self) -> DataLoader:
            return DataLoader(Points(4, seed=2), batch_size=2)

        def predict_dataloader(self) -> DataLoader:
            return DataLoader(Points(4, seed=3), batch_size=2)

        # defined so that they count as overridden in both packages
        def prepare_data(self) -> None: ...
        def configure_model(self) -> None: ...
        def on_validation_model_train(self) -> None:
            self.train()

    class Recorder(pkg.Callback):
        pass

    class Data(pkg.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(Points(8), batch_size=2)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(Points(4, seed=1), batch_size=2)

        def test_dataloader(self) -> DataLoader:
            return DataLoader(Points(4, seed=2), batch_size=2)

        def predict_dataloader(self) -> DataLoader:
            return DataLoader(Points(4, seed=3), batch_size=2)

        def prepare_data(self) -> None: ...

    if datamodule_transfer:
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return batch * 2
        Data.on_after_batch_transfer = on_after_batch_transfer

    model, callback, dm = Net(), Recorder(), Data()
    _wrap(model, MODULE_HOOKS, "", calls)
    _wrap(callback, CALLBACK_HOOKS, "Callback.", calls)
    _wrap(dm, DATAMODULE_HOOKS, "DataModule.", calls)
    return model, callback, dm
