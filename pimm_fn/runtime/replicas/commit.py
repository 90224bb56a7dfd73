"""The step's commit: the gradients averaged over the live replica groups, the optimizer step only if all vote to.

Under ``FaultTolerance`` the run's optimizer carries a step pre-hook
(``vote``): before ``optimizer.step()`` changes anything, the gradients and
the model's floating buffers are all-reduced over the quorum's participants
(one flat buffer per dtype, averaged by torchft's ``Manager.allreduce``), then the manager's
``should_commit()`` votes. A failed vote (a peer died or hung in the
all-reduce, too few groups) takes the gradients away, so the step changes
no parameter and no optimizer state (torch's optimizers leave a parameter
without a gradient as it is), and the driver discards the step
(``Discarded``): no hook sees it, and it is drawn again after a new quorum.
The same parameters must have gradients on every replica group (the same
model, trained on batches of the same structure).
"""

import torch

__all__ = ["Discarded", "vote"]


class Discarded(Exception):
    """The step's commit vote failed: the step is discarded and drawn again after the next quorum (never raised to a user)."""

    def __init__(self, step: int):
        super().__init__(f"step {step} was not committed by every replica group")
        self.step = step


def vote(manager, optimizer, buffers: list[torch.Tensor]) -> bool:
    """Average ``optimizer``'s gradients and the model's floating ``buffers`` over the participants, then vote.

    The buffers (batch norm's running statistics) were moved by this step's
    forward on each replica's own batch: averaged, every replica holds the
    same after the step. On a failed vote the gradients are dropped.
    """
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in (*grads, *buffers):
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in same])
        manager.allreduce(flat).wait()  # an error is the manager's: the vote below fails
        for tensor, part in zip(same, torch.split(flat, [t.numel() for t in same]), strict=True):
            tensor.copy_(part.view_as(tensor))
    committed = manager.should_commit()
    if not committed:
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
    return committed
