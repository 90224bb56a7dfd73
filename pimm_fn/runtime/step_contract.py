"""What a train step is handed and must return, and the errors that say so when a batch or a model breaks it.

Three contracts, one per kind of step:

* the default step: ``model(batch)`` with the whole batch returns a mapping
  with a ``"loss"``, which it trains on;
* ``TrainStep(loss_fn=...)``, the supervised step: a batch is ``(input,
  target)``, a tuple or list of two or a mapping with named keys, and it
  trains on ``loss_fn(model(input), target)``;
* a custom ``step_fn(model, optimizer, batch, *, scheduler=None,
  scaler=None)``: one optimizer step, the scheduler and the GradScaler
  handed as keywords (``None`` when the run has none), returning the
  step's outputs, ``{"loss": loss, ...}``.

A batch or a model output a step cannot use fails with the contract it
broke and the fix, not inside torch (``linear(): argument 'input' must be
Tensor, not list``); a ``step_fn`` that cannot take the keywords is refused
by ``loop()`` from its signature, or at its first call when it has none to
read.

``owner`` in each function below is the step as its errors name it: a
``TrainStep`` (its repr, the call that made it) or a phrase ("the default
step"); it is formatted only when an error is raised, never per step.
"""

from collections.abc import Mapping

import torch

from pimm_fn.core.validate import refused_call

__all__ = [
    "STEP_FN", "INPUT_KEYS", "TARGET_KEYS", "check_step_fn", "call_refused", "forward_refused", "no_loss",
    "supervised", "check_loss",
]

STEP_FN = "step_fn(model, optimizer, batch, *, scheduler=None, scaler=None) -> {'loss': loss, ...}"
SUPERVISED = "pimm_fn.TrainStep(loss_fn=...)"
INPUT_KEYS = ("input", "inputs", "x")  # where a mapping batch holds the input, first found wins
TARGET_KEYS = ("target", "targets", "label", "labels", "y")  # and the target (the loader evaluator's too)


def _named(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def check_step_fn(step_fn) -> None:
    """Refuse a ``step_fn`` whose signature cannot take the loop's call (``STEP_FN``), before anything runs.

    Raises:
        TypeError: naming the step, its signature, the call and the fix.
    """
    signature = refused_call(step_fn, None, None, None, scheduler=None, scaler=None)
    if signature is not None:
        raise TypeError(_refused(step_fn, signature))


def _refused(step_fn, signature) -> str:
    shown = f"{_named(step_fn)}{signature if signature is not None else ''}"
    return (
        f"loop: step_fn {shown} cannot be called as the loop calls it, {STEP_FN}: the scheduler and the "
        f"GradScaler come as keywords (None when the run has none). Take them "
        f"(def step(model, optimizer, batch, *, scheduler=None, scaler=None), or **kwargs), do one optimizer "
        f"step and return its outputs"
    )


def call_refused(error: TypeError, step_fn) -> TypeError:
    """The error to raise for ``error`` from calling ``step_fn``: the contract when the call itself could not bind.

    A call that could not bind raises in the caller's frame (no frame of
    ``step_fn`` in its traceback): that is a step without a signature to
    check, which broke the contract. A ``TypeError`` from inside the step is
    its own, returned as it is.
    """
    if error.__traceback__ is None or error.__traceback__.tb_next is not None:
        return error
    refused = TypeError(f"{_refused(step_fn, None)} (it raised TypeError: {error})")
    refused.__cause__ = error
    return refused


def forward_refused(error: TypeError, batch, owner) -> TypeError:
    """The error to raise for ``error`` from ``model(batch)`` in a step that hands the model the whole batch.

    When torch refused the batch's own type (``must be Tensor, not list``),
    the model takes its input alone: the contract and the supervised step
    are the fix. Any other ``TypeError`` is returned as it is.
    """
    kind = type(batch).__name__
    if not isinstance(batch, (list, tuple, Mapping)) or kind not in str(error):
        return error
    refused = TypeError(
        f"{owner} calls model(batch) with the whole batch (a {kind} here) and trains on its 'loss', but the model "
        f"refused it: {error}. For (input, target) batches pass loop(step_fn={SUPERVISED}): it trains on "
        f"loss_fn(model(input), target); else have forward take the batch and return {{'loss': loss, ...}}"
    )
    refused.__cause__ = error
    return refused


def no_loss(outputs, owner) -> TypeError:
    """The error for a model output without a ``"loss"`` in a step that trains on ``model(batch)["loss"]``."""
    got = (f"a {type(outputs).__name__} with keys {sorted(map(str, outputs))}" if isinstance(outputs, Mapping)
           else f"a {type(outputs).__name__}")
    return TypeError(
        f"{owner} trains on model(batch)['loss'], but model(batch) returned {got}: return {{'loss': loss, ...}} from "
        f"forward, or, for a model that returns predictions, pass loop(step_fn={SUPERVISED}) (it trains on "
        f"loss_fn(model(input), target))"
    )


def _first(batch: Mapping, names) -> str | None:
    return next((name for name in names if name in batch), None)


def supervised(batch, keys, owner) -> tuple:
    """``(input, target)`` of a supervised batch: a tuple or list of two, or a mapping's ``keys`` (else the usual names).

    ``keys`` names a mapping's input and target; ``None`` takes the first of
    ``INPUT_KEYS`` and of ``TARGET_KEYS`` the mapping holds.

    >>> supervised((1, 2), None, "step"), supervised({"x": 1, "label": 2}, None, "step")
    ((1, 2), (1, 2))

    Raises:
        TypeError: a batch of another shape, naming what came and the fix.
    """
    if isinstance(batch, Mapping):
        names = keys or (_first(batch, INPUT_KEYS), _first(batch, TARGET_KEYS))
        if all(name is not None and name in batch for name in names):
            return batch[names[0]], batch[names[1]]
        found = sorted(map(str, batch))
        fix = f"name them: keys=({found[0]!r}, {found[1]!r})" if len(found) == 2 else "name them: keys=(input_key, target_key)"
        got = f"a {type(batch).__name__} with keys {found}" + (f" (keys={keys!r} asked)" if keys else "")
    elif isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    else:
        got = (f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, (list, tuple))
               else f"a {type(batch).__name__}")
        fix = "have the dataset return (input, target) pairs"
    raise TypeError(
        f"{owner} takes (input, target) batches: a tuple or list of two, or a mapping with the input under one of "
        f"{list(INPUT_KEYS)} and the target under one of {list(TARGET_KEYS)}; got {got}: {fix}"
    )


def check_loss(loss, owner):
    """``loss`` when it is one number to backward (a one-element tensor), else a ``TypeError`` with the fix."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss
    got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
    raise TypeError(
        f"{owner}: loss_fn(output, target) must return the batch's loss as a one-element tensor, to backward "
        f"(got {got}): reduce it (reduction='mean', or .mean())"
    )
