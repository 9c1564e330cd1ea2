"""``LightningDataModule``: the data side of a fit in one object (Lightning's ``core.datamodule``).

The Trainer calls ``prepare_data`` (once per machine), ``setup(stage)``, the
stage's ``*_dataloader()`` and ``teardown(stage)``, as Lightning does.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sized
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.hparams import HyperparametersMixin
from gpulayer.trainer.module import _restricted_classmethod
from gpulayer.trainer.utilities.collections import apply_to_collection
from gpulayer.trainer.utilities.parsing import AttributeDict


class _NotDefined(MisconfigurationException, NotImplementedError):
    """A stage's loader the datamodule does not define: Lightning's error type, and still a NotImplementedError."""


class LightningDataModule(HyperparametersMixin):
    """Subclass and define ``train_dataloader`` (and ``val_/test_/predict_dataloader``) as in Lightning.

    >>> class Data(LightningDataModule):
    ...     def setup(self, stage): self.ds = make_dataset()
    ...     def train_dataloader(self): return DataLoader(self.ds, batch_size=32)
    """

    name: str | None = None
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self) -> None:
        self.trainer = None
        self._hparams = AttributeDict()
        self.prepare_data_per_node = True
        self.allow_zero_length_dataloader_with_multiple_devices = False

    @_restricted_classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             weights_only: bool | None = None, **kwargs: Any) -> "LightningDataModule":
        """A new ``cls`` from the datamodule hyperparameters the checkpoint saved (``kwargs`` override them)."""
        from gpulayer.trainer.core.saving import load_from_checkpoint
        return load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, None, weights_only, **kwargs)

    def prepare_data(self) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...

    def train_dataloader(self) -> Any:
        raise _NotDefined("`train_dataloader` must be implemented to be used with the Lightning Trainer")

    def val_dataloader(self) -> Any:
        raise _NotDefined("`val_dataloader` must be implemented to be used with the Lightning Trainer")

    def test_dataloader(self) -> Any:
        raise _NotDefined("`test_dataloader` must be implemented to be used with the Lightning Trainer")

    def predict_dataloader(self) -> Any:
        raise _NotDefined("`predict_dataloader` must be implemented to be used with the Lightning Trainer")

    # the batch-transfer hooks: when overridden here, the Trainer calls these instead of the module's
    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        from gpulayer.trainer.prefetch import move_data_to_device
        return move_data_to_device(batch, device)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def on_exception(self, exception: BaseException) -> None: ...

    @classmethod
    def from_datasets(cls, train_dataset: Any = None, val_dataset: Any = None, test_dataset: Any = None,
                      predict_dataset: Any = None, batch_size: int = 1, num_workers: int = 0,
                      **datamodule_kwargs: Any) -> "LightningDataModule":
        """A datamodule serving the given datasets (each a Dataset, or a collection of them).

        ``batch_size`` and ``num_workers`` go to the loaders, and to ``cls.__init__`` too when it
        takes them; ``datamodule_kwargs`` go to ``cls.__init__``. Training loaders shuffle
        (map-style datasets only); all pin memory, as Lightning's.
        """
        def loader(ds: Dataset, shuffle: bool = False) -> DataLoader:
            return DataLoader(ds, batch_size=batch_size, shuffle=shuffle and not isinstance(ds, IterableDataset),
                              num_workers=num_workers, pin_memory=True)

        def serve(datasets: Any, shuffle: bool) -> Any:
            return lambda: apply_to_collection(datasets, Dataset, loader, shuffle=shuffle)

        params = inspect.signature(cls.__init__).parameters
        special = {"batch_size": batch_size, "num_workers": num_workers}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            special = {k: v for k, v in special.items() if k in params}
        dm = cls(**datamodule_kwargs, **special)
        for name, datasets, shuffle in (("train", train_dataset, True), ("val", val_dataset, False),
                                        ("test", test_dataset, False), ("predict", predict_dataset, False)):
            if datasets is not None:
                setattr(dm, f"{name}_dataloader", serve(datasets, shuffle))
        return dm

    def __str__(self) -> str:
        """One ``{<Stage> dataloader: size=N}`` line per stage (``None`` where the loader is not available)."""
        lines = []
        for label, method in (("Train dataloader", "train_dataloader"), ("Validation dataloader", "val_dataloader"),
                              ("Test dataloader", "test_dataloader"), ("Predict dataloader", "predict_dataloader")):
            try:
                loaders = getattr(self, method)()
            except Exception:  # not defined, or its data not set up yet
                lines.append(f"{{{label}: None}}")
                continue
            sizes = apply_to_collection(loaders, DataLoader, _dataset_size)
            if sizes is None:
                text = "None"
            elif isinstance(sizes, str):
                text = f"size={sizes}"
            else:
                items = list(sizes.values()) if isinstance(sizes, dict) else list(sizes or [])
                text = " ; ".join(f"{i}. size={s}" if isinstance(s, str) else "None" for i, s in enumerate(items, 1))
            lines.append(f"{{{label}: {text}}}")
        return os.linesep.join(lines)


def _dataset_size(loader: DataLoader) -> str:
    return str(len(loader.dataset)) if isinstance(loader.dataset, Sized) else "NA"
