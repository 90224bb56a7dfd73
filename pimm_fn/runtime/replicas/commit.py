"""The step's commit: the gradients averaged over the live replica groups, the update only if all vote to.

Every step votes exactly once (``Replicas.vote``), as soon as its
gradients are complete and before anything reads them for the update. The
built-in steps (the default one, a ``TrainStep``) are handed the vote and
call it after their backward, before the GradScaler or the optimizer
steps: so the scaler unscales gradients that are the same on every group,
and every group skips an overflowing step, or steps it, alike. A custom
``step_fn`` votes at its first ``optimizer.step()`` (a step pre-hook on each
of the run's optimizers); a step that updates nothing (its batch skipped
under ``on_nonfinite="skip"``) votes after it, from the driver.

The vote (``vote``) all-reduces every optimizer's gradients and the model's
floating buffers over the quorum's participants (one flat buffer per dtype,
averaged by torchft's ``Manager.allreduce``), then the manager's
``should_commit()`` says whether to commit. A failed vote (a peer died or
hung in the all-reduce, too few groups) takes the gradients away: the
built-in steps step neither the optimizer, the scaler nor the scheduler,
and torch's optimizers leave a parameter without a gradient as it is. The
driver then discards the step (``Discarded``): no hook sees it, and it is
drawn again after a new quorum. The same parameters must have gradients
on every replica group (the same model, trained on batches of the same
structure), and a step's every backward comes before its first optimizer
step (a later one is refused: ``Replicas``).

``anywhere`` agrees a flag over the participants (one all-reduce): a loss
that is not finite on one group skips the step, warns or raises on all
(``on_nonfinite``).
"""

import torch

__all__ = ["Discarded", "anywhere", "gradients", "vote"]


class Discarded(Exception):
    """The step's commit vote failed: the step is discarded and drawn again after the next quorum (never raised to a user)."""

    def __init__(self, step: int):
        super().__init__(f"step {step} was not committed by every replica group")
        self.step = step


def gradients(optimizers) -> list[torch.Tensor]:
    """The gradients of ``optimizers``' parameters, each parameter once, in the optimizers' order."""
    seen: set[int] = set()
    grads = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None and id(p) not in seen:
                    seen.add(id(p))
                    grads.append(p.grad)
    return grads


def vote(manager, optimizers, buffers: list[torch.Tensor]) -> tuple[bool, list[torch.Tensor]]:
    """Average ``optimizers``' gradients and the model's floating ``buffers`` over the participants, then vote.

    The buffers (batch norm's running statistics) were moved by this step's
    forward on each replica's own batch: averaged, every replica holds the
    same after the step. On a failed vote the gradients are dropped.

    Returns:
        ``(committed, the gradients averaged)``.
    """
    grads = gradients(optimizers)
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
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
    return committed, grads


def anywhere(manager, here: bool) -> bool:
    """Whether ``here`` holds on any participant of the quorum (one all-reduce of a flag)."""
    flag = torch.tensor([1.0 if here else 0.0])
    manager.allreduce(flag).wait()  # averaged: above 0 when any participant said so
    return bool(flag.item() > 0)
