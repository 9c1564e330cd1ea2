"""The order in which a DDP fit sees samples, for a one-process reference run.

Lightning (and gpulayer) shard a training loader with ``DistributedSampler(shuffle=True,
seed=<global seed>)``: per epoch a permutation, rank r taking every R-th index. One
optimizer step averages the ranks' gradients over their ``b`` samples each, which
(with plain SGD and a mean loss) equals one step on the union of those samples.
``DDPShardOrder`` yields that union, step by step, so ``DataLoader(ds,
batch_size=R*b, sampler=DDPShardOrder(len(ds), R, b, seed))`` in one process
trains exactly like the R ranks.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class DDPShardOrder(Sampler[int]):
    def __init__(self, n: int, replicas: int, per_rank_batch: int, seed: int):
        assert n % replicas == 0, "a padded DistributedSampler is not reproduced here"
        self.n, self.replicas, self.b, self.seed, self.epoch = n, replicas, per_rank_batch, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        perm = torch.randperm(self.n, generator=g).tolist()
        shards = [perm[r::self.replicas] for r in range(self.replicas)]
        for k in range(0, len(shards[0]), self.b):
            for shard in shards:
                yield from shard[k:k + self.b]
