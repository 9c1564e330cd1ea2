"""``LightningDataModule``: the data side of a fit in one object (Lightning's ``core.datamodule``).

The Trainer calls ``prepare_data`` (once per machine), ``setup(stage)``, the
stage's ``*_dataloader()`` and ``teardown(stage)``, as Lightning does.
"""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.hparams import HyperparametersMixin
from gpulayer.trainer.module import _restricted_classmethod
from gpulayer.trainer.utilities.parsing import AttributeDict


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
                             **kwargs: Any) -> "LightningDataModule":
        """A new ``cls`` from the datamodule hyperparameters the checkpoint saved (``kwargs`` override them)."""
        from gpulayer.trainer.core.saving import load_from_checkpoint
        return load_from_checkpoint(cls, checkpoint_path, map_location, hparams_file, None, **kwargs)

    def prepare_data(self) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...

    def train_dataloader(self) -> Any:
        raise NotImplementedError("`train_dataloader` must be implemented to be used with the Lightning Trainer")

    def val_dataloader(self) -> Any:
        raise NotImplementedError("`val_dataloader` must be implemented to be used with the Lightning Trainer")

    def test_dataloader(self) -> Any:
        raise NotImplementedError("`test_dataloader` must be implemented to be used with the Lightning Trainer")

    def predict_dataloader(self) -> Any:
        raise NotImplementedError("`predict_dataloader` must be implemented to be used with the Lightning Trainer")

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
        """A datamodule serving the given datasets (each a Dataset or a list of them)."""
        from torch.utils.data import DataLoader, IterableDataset

        def loaders(ds: Any, shuffle: bool) -> Any:
            if isinstance(ds, (list, tuple)):
                return [loaders(d, shuffle) for d in ds]
            return DataLoader(ds, batch_size=batch_size, num_workers=num_workers,
                              shuffle=shuffle and not isinstance(ds, IterableDataset))

        dm = cls(**datamodule_kwargs)
        for name, ds, shuffle in (("train", train_dataset, True), ("val", val_dataset, False),
                                  ("test", test_dataset, False), ("predict", predict_dataset, False)):
            if ds is not None:
                setattr(dm, f"{name}_dataloader", lambda ds=ds, shuffle=shuffle: loaders(ds, shuffle))
        return dm
