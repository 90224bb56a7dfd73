"""Evaluating on several ranks: each rank its own part of the data, as many forwards each, the sums reduced once.

``shard_of`` splits a DataLoader by index, ``rank, rank + world, ...``, with
no padding (a ``DistributedSampler`` repeats samples to even the shards,
which would count them twice); ``missing_forwards`` says how many extra
forwards a rank owes when a sharded model's forward is collective; and
``reduce_sums`` adds the per-batch sums of every rank in one all-reduce.
Used by ``pimm_fn.runtime.loader_evaluator``.
"""

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from pimm_fn import dist
from pimm_fn.checkpoint import sharded

__all__ = ["shard_of", "missing_forwards", "reduce_sums", "reduction_device"]


def shard_of(loader, rank: int, world: int):
    """``loader`` over the indices ``rank, rank + world, ...`` of its dataset: no padding, so no sample twice.

    The batch size, collate function, workers and the rest are kept.

    Raises:
        TypeError: a loader that cannot be split by index (an iterable
            dataset, a custom batch sampler, not a DataLoader).
    """
    fix = "pass shard=False and give each rank its own disjoint part of the data"
    if not isinstance(loader, DataLoader):
        raise TypeError(f"loader_evaluator cannot split a {type(loader).__name__} over {world} ranks: {fix}")
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError(f"loader_evaluator cannot split an IterableDataset over {world} ranks by index: {fix}")
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        raise TypeError(f"loader_evaluator cannot split a DataLoader with its own batch_sampler "
                        f"({type(loader.batch_sampler).__name__}) over {world} ranks: {fix}")
    workers = loader.num_workers
    return DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=list(range(rank, len(loader.dataset), world)),
        num_workers=workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
        drop_last=loader.drop_last, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        prefetch_factor=loader.prefetch_factor if workers else None,
    )


def missing_forwards(model, done: int, name: str) -> int:
    """How many forwards this rank owes so every rank ran as many: 0 unless the model is sharded over ranks."""
    if not dist.is_initialized() or dist.world_size() == 1 or not sharded.is_sharded(model):
        return 0
    most = torch.tensor([done], device=dist.collective_device())
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    missing = int(most.item()) - done
    if missing and not done:
        raise ValueError(f"loader_evaluator {name!r}: rank {dist.rank()} holds no sample of the dataset (fewer "
                         f"samples than ranks), but a sharded model's forward needs every rank: evaluate more samples")
    return missing


def reduce_sums(sums: dict) -> dict:
    """``{name: total}`` over every rank: the names any rank saw (0 where a rank saw none), one all-reduce."""
    names = sorted(set().union(*dist.all_gather_object(sorted(sums)))) if dist.is_initialized() else sorted(sums)
    if not names:
        return {}
    device = dist.collective_device()
    totals = torch.stack([torch.as_tensor(sums.get(n, 0.0), dtype=torch.float64).to(device) for n in names])
    if dist.is_initialized():
        torch.distributed.all_reduce(totals)
    return dict(zip(names, totals.tolist()))
