"""The rest of an interrupted ``DistributedSampler`` epoch, shared over another number of ranks.

A ``DistributedSampler`` epoch is one permutation of the dataset (from its
``seed`` and the epoch), dealt round-robin to the ranks: on ``W`` ranks,
rank ``r`` takes positions ``r, r + W, r + 2W, ...``. After ``i`` steps of
``b`` samples on every rank, the epoch has consumed exactly the first
``i * b * W`` positions of that permutation, whatever ``r``. A run resumed
on ``W'`` ranks continues the epoch with the positions from there on, dealt
the same way over its own ranks: no sample is repeated or skipped.

The stock sampler always starts at position 0, so for the rest of that one
epoch the loader's batch sampler is lent a ``Remainder`` (the rank's share
of the rest) in place of its sampler; the feed gives the sampler back when
the epoch ends. Like ``DistributedSampler``, the share is padded to a
multiple of ``W'`` by repeating the rest's first samples (at most ``W' - 1``
of them are then seen twice in that epoch), or cut to a multiple of ``W'``
under ``drop_last=True``.

>>> order = list(range(10))
>>> share(order, 4, num_replicas=2, rank=1, drop_last=False)
[5, 7, 9]
"""

import copy

from torch.utils.data import DistributedSampler

__all__ = ["Remainder", "why_not", "epoch_order", "share", "lend", "give_back"]


class Remainder:
    """One rank's share of an epoch's rest: the sampler a loader is lent for that epoch."""

    def __init__(self, indices, sampler):
        self.indices = list(indices)
        self.sampler = sampler  # the loader's own, given back when the epoch ends

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)

    def __repr__(self):
        return f"Remainder({len(self.indices)} samples, lent in place of {type(self.sampler).__name__})"


def why_not(data) -> str | None:
    """Why ``data``'s epoch cannot be continued at a permutation position, or ``None`` when it can."""
    sampler = getattr(data, "sampler", None)
    if type(sampler) is not DistributedSampler:  # a subclass may deal its samples otherwise
        return f"its sampler is a {type(sampler).__name__}, not a torch DistributedSampler"
    batches = getattr(data, "batch_sampler", None)
    if getattr(batches, "sampler", None) is not sampler or not isinstance(getattr(data, "batch_size", None), int):
        return "its loader does not batch its DistributedSampler with a batch_size"
    return None


def epoch_order(sampler: DistributedSampler, epoch: int) -> list[int]:
    """The whole permutation ``sampler`` deals out in ``epoch``: its own code, on one rank, unpadded."""
    whole = copy.copy(sampler)
    whole.num_replicas, whole.rank, whole.drop_last = 1, 0, False
    whole.num_samples = whole.total_size = len(sampler.dataset)
    whole.set_epoch(epoch)
    return list(whole)


def share(order, offset: int, *, num_replicas: int, rank: int, drop_last: bool) -> list[int]:
    """Rank ``rank``'s positions of ``order`` from ``offset`` on, dealt as ``DistributedSampler`` deals."""
    rest = list(order[offset:])
    if drop_last:
        rest = rest[: len(rest) - len(rest) % num_replicas]
    else:
        padding = -len(rest) % num_replicas
        rest += (rest * (padding // max(len(rest), 1) + 1))[:padding]
    return rest[rank::num_replicas]


def lend(data, epoch: int, offset: int) -> Remainder:
    """Lend ``data``'s batch sampler this rank's share of ``epoch`` from global position ``offset``."""
    sampler = data.sampler
    indices = share(epoch_order(sampler, epoch), offset, num_replicas=sampler.num_replicas, rank=sampler.rank,
                    drop_last=sampler.drop_last)
    remainder = Remainder(indices, sampler)
    data.batch_sampler.sampler = remainder
    return remainder


def give_back(data) -> None:
    """Put ``data``'s own sampler back in its batch sampler, if a ``Remainder`` was lent."""
    batches = getattr(data, "batch_sampler", None)
    lent = getattr(batches, "sampler", None)
    if isinstance(lent, Remainder):
        batches.sampler = lent.sampler
