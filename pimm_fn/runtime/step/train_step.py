"""The default training step: its batch moved to the device, its outputs turned to numbers, and the contract every step keeps.

``train_step`` is one optimizer step on ``model(batch)["loss"]``;
``runner`` is how the loop calls a step function, with the outputs read at
once or left on the device (``pimm_fn.runtime.engine.outputs``). What the loop does
with a NaN or infinite loss is the ``NonFinite`` policy the default step is
handed (a ``TrainStep`` too, under ``"skip"``): ``pimm_fn.runtime.step.nonfinite``.
What each kind of step is handed and returns, and the errors naming it:
``pimm_fn.runtime.step.train_step``.

A batch moved to a device: every tensor inside, each container rebuilt in its own type.

What ``TrainStep(device=...)`` does to each batch before the forward, and
the loader evaluator and ``Loop.predict`` before theirs.

What a train step is handed and must return, and the errors that say so when a batch or a model breaks it.

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

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from pimm_fn.core.validate import refused_call
from pimm_fn.runtime.engine.outputs import device_outputs
from pimm_fn.runtime.step.nonfinite import NonFinite

__all__ = [
    "to_device",
    "STEP_FN",
    "INPUT_KEYS",
    "TARGET_KEYS",
    "check_step_fn",
    "call_refused",
    "forward_refused",
    "no_loss",
    "supervised",
    "check_loss",
    "train_step",
    "train_step_scalars",
    "scalar_outputs",
    "runner",
]


def to_device(batch, device):
    """``batch`` with every tensor inside moved to ``device`` (``non_blocking``); other values pass through.

    Looks inside dicts (and other mappings), lists, tuples, namedtuples and
    dataclass instances, at any depth, rebuilding each container's type.

    >>> to_device({"x": [torch.zeros(2)], "name": "a"}, "cpu")["x"][0].device
    device(type='cpu')
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return _mapping(batch, {key: to_device(value, device) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple: its fields are positional
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {f.name: to_device(getattr(batch, f.name), device) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **fields)
    return batch


def _mapping(original, moved: dict):
    """``moved`` in the mapping type of ``original`` (a plain dict when that type cannot be rebuilt)."""
    if type(original) is dict:
        return moved
    if isinstance(original, dict):  # OrderedDict, defaultdict: a copy keeps their extra attributes
        copy = original.copy()
        copy.update(moved)
        return copy
    try:
        return type(original)(moved)
    except TypeError:
        return moved


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
    got = (
        f"a {type(outputs).__name__} with keys {sorted(map(str, outputs))}"
        if isinstance(outputs, Mapping)
        else f"a {type(outputs).__name__}"
    )
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
    if isinstance(batch, (list, tuple)) and len(batch) == 2:  # a DataLoader's pair: told before the Mapping check
        return batch[0], batch[1]
    if isinstance(batch, Mapping):
        names = keys or (_first(batch, INPUT_KEYS), _first(batch, TARGET_KEYS))
        if all(name is not None and name in batch for name in names):
            return batch[names[0]], batch[names[1]]
        found = sorted(map(str, batch))
        fix = (
            f"name them: keys=({found[0]!r}, {found[1]!r})"
            if len(found) == 2
            else "name them: keys=(input_key, target_key)"
        )
        got = f"a {type(batch).__name__} with keys {found}" + (f" (keys={keys!r} asked)" if keys else "")
    else:
        got = (
            f"a {type(batch).__name__} of {len(batch)}"
            if isinstance(batch, (list, tuple))
            else f"a {type(batch).__name__}"
        )
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


_DEFAULT = "the default step (no step_fn)"


def _autocast(model, scaler):
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return contextlib.nullcontext()
    device = next((p.device.type for p in model.parameters()), "cpu")
    return torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16)


def _optimize(model, optimizer, batch, scheduler=None, scaler=None, nonfinite=None, commit=None) -> tuple:
    """The default step's work; returns ``(model outputs, loss, loss value)``.

    The value (a float) is read only under ``"skip"``, before the backward,
    so a skipped batch never reaches the optimizer; else ``None`` (the other
    policies sum the losses on the device: ``NonFinite.watch``). ``commit``:
    the replica groups' vote under ``FaultTolerance``, cast after the
    backward, before the scaler or the optimizer reads a gradient (False:
    nothing is stepped; ``pimm_fn.runtime.replicas.commit``).
    """
    optimizer.zero_grad(set_to_none=True)
    try:
        if scaler is None:
            outputs = model(batch)
        else:
            with _autocast(model, scaler):
                outputs = model(batch)
    except TypeError as error:  # torch refusing a (input, target) batch: the contract, not "must be Tensor"
        raise forward_refused(error, batch, _DEFAULT)
    if not (outputs.__class__ is dict or isinstance(outputs, Mapping)) or "loss" not in outputs:
        raise no_loss(outputs, _DEFAULT)
    loss = outputs["loss"]
    value = None
    if nonfinite is not None:
        if nonfinite.before_update:
            value = loss.item()
            if not nonfinite.finite(value, loss.device) and not nonfinite(value):
                return outputs, loss, value  # skipped: no backward ran, so the gradients stay zeroed
    if scaler is not None:
        scaler.scale(loss).backward()
        if commit is not None and not commit():
            return outputs, loss, value  # not committed: the gradients are dropped, nothing steps
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        if commit is not None and not commit():
            return outputs, loss, value
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return outputs, loss, value


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> Mapping:
    """One optimizer step on ``batch``: ``loss = model(batch)["loss"]``, backward, step.

    With a ``torch.amp.GradScaler`` the forward runs under autocast and the
    loss is scaled. The scheduler, if any, steps once per call; the loop
    passes ``scheduler=None`` when a hook steps it (``step_scheduler``).

    Returns:
        The model's outputs with a detached ``loss`` and the first group's ``lr``.
    """
    outputs, loss, _ = _optimize(model, optimizer, batch, scheduler, scaler)
    return {**outputs, "loss": loss.detach(), "lr": optimizer.param_groups[0]["lr"]}


def train_step_scalars(model, optimizer, batch, scheduler=None, scaler=None, *, nonfinite=None) -> dict:
    """``scalar_outputs(train_step(...))`` in one call: the default step's outputs read at once, as floats.

    Equal to the two calls, in value and key order, without building the
    intermediate dict or detaching the loss (``item()`` reads it directly).
    Under a ``nonfinite`` policy the loss is read once, before the backward.
    """
    outputs, loss, value = _optimize(model, optimizer, batch, scheduler, scaler, nonfinite)
    lr = optimizer.param_groups[0]["lr"]
    if len(outputs) == 1 and loss.__class__ is torch.Tensor and lr.__class__ is float:
        # {"loss": loss}, what most models return; backward() took it, so it is one float element.
        return {"loss": loss.item() if value is None else value, "lr": lr}
    return scalar_outputs({**outputs, "lr": lr} if value is None else {**outputs, "loss": value, "lr": lr})


def scalar_outputs(outputs) -> dict:
    """The step's numeric scalars as floats: ``device_outputs`` read at once; other outputs (logits) are dropped."""
    return {
        name: value if value.__class__ is float else float(value.item())
        for name, value in device_outputs(outputs).items()
    }


def runner(step_fn, read: bool, nonfinite: NonFinite | None = None, commit=None):
    """``run(model, optimizer, batch, scheduler, scaler) -> outputs`` for ``step_fn``, reading nothing.

    The outputs are the step's numeric scalars as they are, device tensors
    included (``pimm_fn.runtime.engine.outputs``): the loop reads them where a hook
    reads them, at each epoch's end, and every ``WAIT_AT_MOST`` steps. When no hook listens to
    ``AfterStep`` (``read`` False) they are only the loss a ``nonfinite``
    policy checks later (``"raise"``, ``"warn"``); ``"skip"`` has the default
    step read its loss before the backward, and a ``TrainStep`` (the only
    other step ``loop()`` allows it with) is handed the policy
    (``nonfinite=``) to read its loss before the update. ``commit``: under
    ``FaultTolerance``, the replica groups' vote, which a built-in step
    casts after its backward (a ``TrainStep`` is handed it as ``commit=``).
    """
    later = nonfinite is not None and not nonfinite.before_update  # the loss, read with the outputs
    if step_fn is train_step:

        def run_train_step(model, optimizer, batch, scheduler, scaler):
            outputs, loss, value = _optimize(model, optimizer, batch, scheduler, scaler, nonfinite, commit)
            if not read:
                return {"loss": loss.detach()} if later else {}
            lr = optimizer.param_groups[0]["lr"]
            if len(outputs) == 1 and lr.__class__ is float:  # {"loss": loss}, what most models return
                return {"loss": loss.detach() if value is None else value, "lr": lr}
            return device_outputs({**outputs, "loss": loss if value is None else value, "lr": lr})

        return run_train_step

    handed = {}  # what only a TrainStep takes: a policy read before the update, the replica groups' vote
    if nonfinite is not None and nonfinite.before_update:
        handed["nonfinite"] = nonfinite
    if commit is not None:
        handed["commit"] = commit

    def run(model, optimizer, batch, scheduler, scaler):
        try:
            if not handed:
                outputs = step_fn(model, optimizer, batch, scheduler=scheduler, scaler=scaler)
            else:
                outputs = step_fn(model, optimizer, batch, scheduler=scheduler, scaler=scaler, **handed)
        except TypeError as error:  # a step whose signature loop() could not read: the contract it broke
            raise call_refused(error, step_fn)
        if read:
            return device_outputs(outputs)
        loss = _loss(outputs) if later else None
        return device_outputs({"loss": loss}) if loss is not None else {}

    return run


def _loss(outputs):
    """The ``"loss"`` a custom step returned (``None`` when it reports none)."""
    if outputs is None:
        return None
    if outputs.__class__ is dict or isinstance(outputs, Mapping):
        return outputs.get("loss")
    return outputs
