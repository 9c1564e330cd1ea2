"""Small random datasets and minimal modules for tests and debugging, at Lightning's import path.

Lightning users import these by name (``lightning.pytorch.demos.boring_classes``) in their
tests; here they have the same names, constructor arguments, shapes, random draws and
defaults, so a test written against Lightning's sees the same numbers for the same seed:

- ``RandomDataset(size, length)``: ``length`` rows of ``size`` normal draws, drawn once.
- ``BoringModel``: one ``Linear(32, 2)``; the loss is the MSE of its output against ones;
  SGD (lr 0.1) with a ``StepLR(step_size=1)``; 64 rows of ``RandomDataset(32, 64)`` for
  every stage.
- ``BoringDataModule``: 256 rows, split into four quarters (fit, validate, test, predict).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from gpulayer.trainer.datamodule import LightningDataModule
from gpulayer.trainer.module import LightningModule

__all__ = [
    "BoringDataModule", "BoringDataModuleNoLen", "BoringModel", "DemoModel", "IterableBoringDataModule",
    "ManualOptimBoringModel", "Net", "RandomDataset", "RandomDictDataset", "RandomIterableDataset",
    "RandomIterableDatasetWithLen",
]


# -- datasets ---------------------------------------------------------------------------------
class RandomDataset(Dataset):
    """``length`` samples, each a vector of ``size`` standard-normal values drawn at construction."""

    def __init__(self, size: int, length: int):
        self.len = length
        self.data = torch.randn(length, size)

    def __len__(self) -> int:
        return self.len

    def __getitem__(self, index: int) -> Tensor:
        return self.data[index]


class RandomDictDataset(RandomDataset):
    """As ``RandomDataset``, each sample a dict: ``{"a": x, "b": x + 2}``."""

    def __getitem__(self, index: int) -> dict[str, Tensor]:  # type: ignore[override]
        row = self.data[index]
        return {"a": row, "b": row + 2}


class RandomIterableDataset(IterableDataset):
    """``count`` fresh vectors of ``size`` normal values per pass; no ``__len__``."""

    def __init__(self, size: int, count: int):
        self.size, self.count = size, count

    def __iter__(self) -> Iterator[Tensor]:
        return (torch.randn(self.size) for _ in range(self.count))


class RandomIterableDatasetWithLen(RandomIterableDataset):
    """``RandomIterableDataset`` that also reports its ``count`` as its length."""

    def __len__(self) -> int:
        return self.count


# -- modules ------------------------------------------------------------------------------------
class BoringModel(LightningModule):
    """The smallest complete module: subclass it and override the one hook a test is about.

    >>> class CountingModel(BoringModel):
    ...     def on_train_epoch_end(self):
    ...         self.epochs_seen = getattr(self, "epochs_seen", 0) + 1
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def loss(self, preds: Tensor, labels: Tensor | None = None) -> Tensor:
        target = torch.ones_like(preds) if labels is None else labels
        return F.mse_loss(preds, target)

    def step(self, batch: Any) -> Tensor:
        return self.loss(self(batch))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return {"x": self.step(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return {"y": self.step(batch)}

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]

    def _loader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()

    def predict_dataloader(self) -> DataLoader:
        return self._loader()


class ManualOptimBoringModel(BoringModel):
    """``BoringModel`` with ``automatic_optimization = False``: the step zeroes, backpropagates and steps itself."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt = self.optimizers()
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


class DemoModel(LightningModule):
    """``relu(Linear(32, out_dim)(x))``; the loss is the sum of the output; Adam at ``learning_rate``."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02):
        super().__init__()
        self.l1 = nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return self(batch).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class Net(nn.Module):
    """A small MNIST-shaped convolutional net (28 x 28 x 1 in, 10 log-probabilities out)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


# -- data modules -------------------------------------------------------------------------------
_STAGES = ("train", "val", "test", "predict")


class _PerStageDataModule(LightningDataModule):
    """Builds ``random_<stage>`` in ``setup`` (``_make``) and serves a plain ``DataLoader`` over each."""

    def _make(self, stage: str) -> Any:
        raise NotImplementedError

    def setup(self, stage: str) -> None:
        # which datasets each Trainer stage needs: fit also validates
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}
        for name in wanted.get(stage, ()):
            setattr(self, f"random_{name}", self._make(name))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.random_predict)


class BoringDataModule(_PerStageDataModule):
    """256 random rows of 32 values; each stage reads its own quarter (train, val, test, predict)."""

    def __init__(self) -> None:
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def _make(self, stage: str) -> Dataset:
        start = 64 * _STAGES.index(stage)
        return Subset(self.random_full, indices=range(start, start + 64))


class BoringDataModuleNoLen(_PerStageDataModule):
    """Iterable datasets without a length: 512 train, 128 val, 256 test and 64 predict samples."""

    _COUNTS = {"train": 512, "val": 128, "test": 256, "predict": 64}

    def _make(self, stage: str) -> Dataset:
        return RandomIterableDataset(32, self._COUNTS[stage])


class IterableBoringDataModule(LightningDataModule):
    """Two loaders per stage, one map-style and one iterable, of 4-value samples (16, 32, 64, 128 per stage)."""

    _COUNTS = {"train": 16, "val": 32, "test": 64, "predict": 128}
    _ATTRS = {"train": "train_datasets", "val": "val_datasets", "test": "test_datasets", "predict": "predict_datasets"}

    def setup(self, stage: str) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}
        for name in wanted.get(stage, ()):
            n = self._COUNTS[name]
            setattr(self, self._ATTRS[name], [RandomDataset(4, n), RandomIterableDataset(4, n)])

    def _loaders(self, stage: str) -> list[DataLoader]:
        return [DataLoader(ds) for ds in getattr(self, self._ATTRS[stage])]

    def train_dataloader(self) -> list[DataLoader]:
        return self._loaders("train")

    def val_dataloader(self) -> list[DataLoader]:
        return self._loaders("val")

    def test_dataloader(self) -> list[DataLoader]:
        return self._loaders("test")

    def predict_dataloader(self) -> list[DataLoader]:
        return self._loaders("predict")
