"""How the loop runs an evaluator: in eval mode, without autograd, and on the weights asked for.

``evaluating(ctx, weights)`` is the block the ``evaluate`` handler calls an
evaluator in. On entry it swaps a moving average into the model when asked
(``evaluate_every(..., weights="ema")``), records every module's training
flag, calls ``eval()`` on the model as the run holds it (the DDP wrapper
included) and enters ``torch.inference_mode()``. On exit, on any exit (an
evaluator that raises, a Ctrl-C), it restores each module's flag as it was
(an evaluator that called ``model.eval()`` or ``model.train()`` itself
changes nothing for training) and swaps the model's own weights back.

A sharded model (FSDP2) is evaluated under ``torch.no_grad()`` instead:
its all-gathered parameters are buffers it reuses in training, and a
buffer made under inference mode cannot be saved for a later backward.
"""

import contextlib

import torch

from pimm_fn.runtime.context import unwrap

__all__ = ["evaluating", "eval_mode"]


@contextlib.contextmanager
def eval_mode(model):
    """``model.eval()`` for the block; each module's own training flag back after, whatever the block did."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in flags:
            module.training = training


@contextlib.contextmanager
def evaluating(ctx, weights: str | None = None):
    """The block an evaluator runs in (see the module docstring); yields the model to hand it."""
    with contextlib.ExitStack() as stack:
        if weights is not None:
            stack.enter_context(_average(ctx, weights).swapped_into(unwrap(ctx.model)))
        stack.enter_context(eval_mode(ctx.model))
        stack.enter_context(torch.no_grad() if ctx.sharded else torch.inference_mode())
        yield ctx.model


def _average(ctx, name: str):
    found = ctx.extra_state.get(name)
    if found is None or not hasattr(found, "swapped_into"):
        raise LookupError(f"an evaluation asked for the weights {name!r}, but this run keeps no ema(name={name!r})")
    return found
