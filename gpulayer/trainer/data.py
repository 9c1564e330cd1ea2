"""Data loaders: where they come from, how many batches count, and the distributed sampler."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any, Iterable

import torch
from torch.utils.data import (
    BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler,
)

from gpulayer.trainer.errors import TrainerConfigError
from gpulayer.trainer.seed import SEED_ENV, SEED_WORKERS_ENV, worker_init_fn
from gpulayer.trainer.utilities.combined_loader import CombinedLoader
from gpulayer.trainer.utilities.data import has_len_all_ranks


def resolve(loaders: Any) -> Any:
    """A loader, a list of loaders, or a zero-argument factory returning one (called here, in the rank)."""
    if loaders is None or isinstance(loaders, DataLoader) or hasattr(loaders, "__iter__"):
        return loaders
    if callable(loaders):
        return loaders()
    raise TrainerConfigError(
        f"fit() got {type(loaders).__name__} for a data loader; pass a DataLoader, an iterable of batches, "
        "or a function that returns one"
    )


def as_list(loaders: Any) -> list:
    """Evaluation loaders as a list, read one after another (a dict's values, a CombinedLoader's iterables).

    A CombinedLoader in another mode than ``"sequential"`` stays one loader: each step gets a batch of each iterable.
    """
    if loaders is None:
        return []
    if isinstance(loaders, CombinedLoader):
        # sequential: its loaders one after another; another mode: one loader of combined batches (Lightning's)
        return list(loaders.flattened) if loaders._mode == "sequential" else [loaders]
    if isinstance(loaders, (dict, list, tuple)):
        children = list(loaders.values()) if isinstance(loaders, dict) else list(loaders)
        # a container of plain values (``[0, 1]``) is one iterable of batches, as Lightning's flattening has it
        if children and all(isinstance(c, (int, float, str)) for c in children):
            return [loaders]
        return children
    return [loaders]


def as_given(given: Any, prepared: list) -> Any:
    """What ``trainer.val_dataloaders`` & co. show: one loader when one was given, else the list."""
    if len(prepared) == 1 and isinstance(prepared[0], CombinedLoader):
        return prepared[0].iterables
    if len(prepared) == 1 and not isinstance(given, (list, tuple, dict, CombinedLoader)):
        return prepared[0]
    return prepared


def stage_counts(loaders: list, limit: int | float, stage: str) -> list[float]:
    """``trainer.num_<stage>_batches``: per loader, and per iterable of a combined one (its limits are set)."""
    counts: list[float] = []
    for dl in loaders:
        n = num_batches(dl, limit, stage)
        counts.extend(dl.limits if isinstance(dl, CombinedLoader) else [n])
    return counts


def combine_train(loaders: Any) -> Any:
    """Several train loaders (a list, a dict, a CombinedLoader) as one CombinedLoader; one loader as it is.

    Lightning's default for a collection is ``max_size_cycle``: batches of every loader each step,
    the shorter loaders starting over until the longest ends.
    """
    if isinstance(loaders, (list, tuple, dict)):
        return CombinedLoader(loaders, "max_size_cycle")
    return loaders


def batches_of(loader: Any) -> Any:
    """An iterator of ``loader``'s batches (a CombinedLoader's combined batches, without their indices)."""
    return loader._batches() if isinstance(loader, CombinedLoader) else iter(loader)


def num_batches(loader: Iterable, limit: int | float, stage: str = "train") -> float:
    """How many batches of ``loader`` an epoch uses (``inf`` for an unsized iterable), as Lightning counts.

    ``limit``: an int caps the count, a float takes that fraction (rounded down). A fraction that leaves
    no batch of a sized loader is refused: it would silently skip the stage.
    """
    if isinstance(loader, CombinedLoader):
        flat = loader.flattened
        loader.limits = [num_batches(dl, limit, stage) for dl in flat]
        try:
            return loader._total()
        except TypeError:
            return math.inf
    try:
        n = len(loader)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        n = math.inf
    if n == 0:
        return 0
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(n, limit)
    if n == math.inf:
        if limit != 1.0:
            raise TrainerConfigError(
                f"When using an `IterableDataset`, `Trainer(limit_{stage}_batches)` must be `1.0` or an int. An int "
                f"specifies `num_{stage}_batches` to use.")
        return math.inf
    count = int(n * limit)
    if count == 0 and limit > 0.0:
        raise TrainerConfigError(
            f"You requested to check {limit} of the `{stage}_dataloader` but {limit} * {n} < 1. Please increase the "
            f"`limit_{stage}_batches` argument. Try at least `limit_{stage}_batches={1.0 / n}`")
    return count


def check_lengths(loader: Any, trainer: Any) -> None:
    """Lightning's checks of a loader being set up (``has_len_all_ranks``): each loader of a combined one, then
    the whole; warns about an empty loader or a length an ``IterableDataset`` declares, refuses one rank's empty
    loader (unless the module or datamodule sets ``allow_zero_length_dataloader_with_multiple_devices``)."""
    allow = bool(getattr(trainer.lightning_module, "allow_zero_length_dataloader_with_multiple_devices", False))
    allow |= bool(getattr(trainer.datamodule, "allow_zero_length_dataloader_with_multiple_devices", False))
    parts = loader.flattened if isinstance(loader, CombinedLoader) else []
    for dl in (*parts, loader):
        has_len_all_ranks(dl, trainer.strategy, allow)


def without_shuffle(loader: Any, stage: str) -> Any:
    """``overfit_batches``: the same batches every epoch, so a shuffling loader is rebuilt in order (with a warning)."""
    flat = loader.flattened if isinstance(loader, CombinedLoader) else [loader]
    if all(not _reorderable(dl) or isinstance(dl.sampler, SequentialSampler) for dl in flat):
        return loader
    warnings.warn(f"You requested to overfit but enabled {stage} dataloader shuffling. We are turning off the "
                  f"{stage} dataloader shuffling for you.", UserWarning, stacklevel=3)
    flat = [_rebuild(dl, SequentialSampler(dl.dataset)) if _reorderable(dl) else dl for dl in flat]
    if isinstance(loader, CombinedLoader):
        loader.flattened = flat
        return loader
    return flat[0]


def _reorderable(loader: Any) -> bool:
    """A DataLoader whose sampler can be swapped (a map-style dataset, no custom batch sampler)."""
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset) \
        and loader.batch_size is not None


def _rebuild(loader: DataLoader, sampler: Any) -> DataLoader:
    """``loader`` with another sampler, every other setting kept."""
    kwargs = dict(
        batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, drop_last=loader.drop_last, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, persistent_workers=loader.persistent_workers,
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    return DataLoader(loader.dataset, **kwargs)


def seed_workers(loader: Any) -> None:
    """``seed_everything(workers=True)``: give each DataLoader worker a derived seed."""
    if isinstance(loader, CombinedLoader):
        for dl in loader.flattened:
            seed_workers(dl)
        return
    if os.environ.get(SEED_WORKERS_ENV) == "1" and isinstance(loader, DataLoader) and loader.num_workers > 0 \
            and loader.worker_init_fn is None:
        loader.worker_init_fn = worker_init_fn


class UnrepeatedDistributedSampler(DistributedSampler):
    """Each sample on exactly one rank, no padding (Lightning's sampler for ``predict``)."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int, shuffle: bool = False, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.num_samples = len(range(rank, len(dataset), num_replicas))
        self.total_size = len(dataset)

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            order = list(range(len(self.dataset)))
        return iter(order[self.rank:self.total_size:self.num_replicas])


def distributed(loader: Any, num_replicas: int, rank: int, mode: str = "train") -> Any:
    """The same loader, each rank reading its 1/num_replicas share, as Lightning rebuilds it.

    ``mode``: ``"train"`` (always shuffled per epoch, as Lightning does, ``set_epoch``
    each epoch), ``"eval"`` (validate/test: in order, padded like Lightning's) or
    ``"predict"`` (every sample on exactly one rank).
    """
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader  # an iterable that shards itself
    if isinstance(loader.sampler, DistributedSampler):
        return loader
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        raise TrainerConfigError(
            f"the loader uses a custom batch sampler ({type(loader.batch_sampler).__name__}) that gpulayer cannot "
            "split across processes; give it a DistributedSampler yourself, pass Trainer(use_distributed_sampler=False), "
            "or use devices=1"
        )
    # Lightning shuffles every training loader it shards (per epoch, seeded by the global seed), even one built
    # without shuffle=True; evaluation loaders keep their own order
    shuffle = mode == "train" or isinstance(loader.sampler, RandomSampler)
    seed = int(os.environ.get(SEED_ENV, 0))
    if mode == "predict":
        sampler: Any = UnrepeatedDistributedSampler(loader.dataset, num_replicas, rank, shuffle=shuffle, seed=seed)
    else:  # Lightning passes no drop_last to the sampler: it pads; the loader keeps its own drop_last
        sampler = DistributedSampler(loader.dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
    return _rebuild(loader, sampler)


def distribute(trainer: Any, loader: Any, mode: str) -> Any:
    """``loader`` as this rank of ``trainer``'s strategy reads it (a distributed sampler, unless
    ``use_distributed_sampler=False`` or one process); a combined loader: each of its loaders."""
    if trainer.strategy.world_size == 1 or not trainer.config.use_distributed_sampler:
        return loader
    if isinstance(loader, CombinedLoader):  # a combined one (not sequential): each of its loaders
        loader.flattened = [distribute(trainer, dl, mode) for dl in loader.flattened]
        return loader
    return trainer.strategy.prepare_loader(loader, mode)


def from_datamodule(datamodule: Any, method: str) -> Any:
    """``datamodule.<method>()``, or None when the datamodule does not define it (Lightning's base raises)."""
    fn = getattr(datamodule, method, None)
    if fn is None:
        return None
    from gpulayer.trainer.datamodule import LightningDataModule
    if isinstance(datamodule, LightningDataModule) and method not in vars(datamodule) \
            and getattr(type(datamodule), method) is getattr(LightningDataModule, method):
        return None
    return fn()


def set_epoch(loader: Any, epoch: int) -> None:
    if isinstance(loader, CombinedLoader):
        for dl in loader.flattened:
            set_epoch(dl, epoch)
        return
    for obj in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
            return


def shut_down_workers(loader: Any) -> None:
    """Stop the worker processes a DataLoader keeps between epochs (``persistent_workers=True``), as Lightning
    does when a fit ends: otherwise they live on until the loader is garbage-collected. The loader starts new
    ones if it is iterated again."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter  # torch's own class for worker iterators
    for dl in (loader.flattened if isinstance(loader, CombinedLoader) else [loader]):
        it = getattr(dl, "_iterator", None) if isinstance(dl, DataLoader) else None
        if isinstance(it, _MultiProcessingDataLoaderIter):
            it._shutdown_workers()
            dl._iterator = None
