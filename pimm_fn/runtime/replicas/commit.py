"""The step's commit: the gradients averaged over the live replica groups, the optimizer step only if all vote to.

Under ``FaultTolerance`` the run's optimizer carries a step pre-hook
(``vote``): before ``optimizer.step()`` changes anything, the gradients are
all-reduced over the quorum's participants (one flat buffer per dtype,
averaged by torchft's ``Manager.allreduce``), then the manager's
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


def vote(manager, optimizer) -> bool:
    """Average ``optimizer``'s gradients over the participants and vote; on a failed vote the gradients are dropped."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        manager.allreduce(flat).wait()  # an error is the manager's: the vote below fails
        for grad, part in zip(same, torch.split(flat, [g.numel() for g in same]), strict=True):
            grad.copy_(part.view_as(grad))
    committed = manager.should_commit()
    if not committed:
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
    return committed
