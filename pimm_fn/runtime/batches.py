"""What a step gets from the feed (one batch, or a group of micro-batches) and how many samples it holds."""

import torch

__all__ = ["MicroBatches", "batch_size"]

_Tensor = torch.Tensor


class MicroBatches(tuple):
    """The ``k`` batches of one optimizer step, as a grouped feed gives them (``Feed(group=k)``)."""

    __slots__ = ()

    def __repr__(self):
        return f"MicroBatches({list(self)!r})"


def batch_size(batch) -> int:
    """The samples in ``batch``: the first dimension of its first tensor (0 when it has none)."""
    cls = batch.__class__
    if cls is MicroBatches:  # a step's micro-batches: all their samples
        return sum(batch_size(part) for part in batch)
    if (cls is tuple or cls is list) and batch:  # the common (inputs, targets) batch, without a getattr miss
        first = batch[0]
        if first.__class__ is _Tensor:  # a plain tensor: its shape, without a call
            shape = first.shape
            return shape[0] if shape else 0
        return batch_size(first)
    shape = getattr(batch, "shape", None)
    if shape:
        return int(shape[0])
    if isinstance(batch, dict):
        return max((batch_size(v) for v in batch.values()), default=0)
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    return 0
