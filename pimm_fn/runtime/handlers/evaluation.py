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

``evaluate`` is the handler of the ``Evaluate`` effect: it runs the named
evaluator in that block, checks what it returned, broadcasts the main rank's
result (``broadcast=True``) and hands the published names to the run's
``Advice`` (after the broadcast, so every rank judges the same values).
"""

import contextlib
import numbers
from collections.abc import Mapping

import torch

from pimm_fn import dist
from pimm_fn.core.effects import Evaluate, WriteBest, named
from pimm_fn.core.events import MetricsPublished
from pimm_fn.runtime.engine.interpreter import unwrap

__all__ = ["evaluating", "eval_mode", "evaluate", "as_metrics"]


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


def as_metrics(result, name) -> dict | None:
    """Evaluator ``name``'s result as ``{metric: float}`` (``None`` stays ``None``).

    A result of the wrong type, or a metric whose value is not a number,
    raises a ``TypeError`` naming the evaluator and the metric; a metric named
    like a log record's own field (``step``, ``kind``, ``epoch``, ...), or two
    alike once written (``1`` and ``"1"``), a ``ValueError``
    (``pimm_fn.core.effects``). NaN and +/-inf pass (the hooks ignore them
    for a best; ``Advice`` says so).
    """
    if result is None:
        return None
    if isinstance(result, numbers.Real) or _one_number(result):
        result = {name: result}
    if not isinstance(result, Mapping):
        raise TypeError(
            f"evaluator {name!r} must return a mapping of metric names to numbers, a number or None "
            f"(got {type(result).__name__}: {result!r:.80})"
        )
    return named({k: _metric(name, k, v) for k, v in result.items()}, f"evaluator {name!r} returned metric", name)


def _one_number(value) -> bool:
    """A one-element tensor or array (``torch.tensor(0.5)``): a number, published under the evaluator's name."""
    return not isinstance(value, (str, bytes, Mapping)) and getattr(value, "numel", lambda: 0)() == 1


def _metric(evaluator: str, key, value) -> float:
    """``value`` as a float, or a ``TypeError``/``ValueError`` naming the evaluator and the metric."""
    fix = "return numbers (an int, a float or a one-element tensor) for each metric"
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(
            f"evaluator {evaluator!r} returned metric {key!r} as a {type(value).__name__} ({value!r:.80}): {fix}"
        )
    try:
        return float(value)
    except OverflowError:
        raise ValueError(
            f"evaluator {evaluator!r} returned metric {key!r} = {value!r:.80}, too large for a float: {fix}"
        ) from None
    except Exception:  # a list, a dict, a tensor of several elements
        raise TypeError(
            f"evaluator {evaluator!r} returned metric {key!r} as a {type(value).__name__} ({value!r:.80}), "
            f"which is not one number: {fix}"
        ) from None


def evaluate(effect: Evaluate, state, ctx) -> tuple:
    """Run the evaluator in its own mode (``pimm_fn.runtime.handlers.evaluation``), so training resumes as it was."""
    fn = ctx.evaluators.get(effect.evaluator)
    if fn is None:
        raise LookupError(f"no evaluator named {effect.evaluator!r} (known: {sorted(ctx.evaluators)})")
    if not effect.broadcast and WriteBest in ctx.everywhere:
        raise ValueError(
            f"evaluator {effect.evaluator!r} publishes rank-local metrics (broadcast=False), but this run's model is "
            f"sharded, so writing model_best gathers it on every rank and every rank must decide alike: evaluate "
            f"with broadcast=True (the default)"
        )
    with evaluating(ctx, effect.weights) as model:  # eval mode, inference mode; training's mode and weights back after
        values = as_metrics(fn(model), effect.evaluator)
    if effect.broadcast:
        values = dist.broadcast_object(values)
    if ctx.advice is not None:  # after the broadcast: a misspelt metric is refused on every rank alike
        ctx.advice.evaluated(
            effect.evaluator, values, step=effect.step, consistent=effect.broadcast or ctx.world_size == 1
        )
    return (
        MetricsPublished(
            values or {}, effect.evaluator, effect.step, consistent=effect.broadcast, weights=effect.weights
        ),
    )
