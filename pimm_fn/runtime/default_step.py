"""The default training step and the conversion of its outputs to numbers.

``train_step`` is one optimizer step on ``model(batch)["loss"]``;
``runner`` is how the loop calls a step function, with the outputs read at
once or left on the device (``pimm_fn.runtime.outputs``). What the loop does
with a NaN or infinite loss is the ``NonFinite`` policy the default step is
handed (a ``TrainStep`` too, under ``"skip"``): ``pimm_fn.runtime.nonfinite``.
What each kind of step is handed and returns, and the errors naming it:
``pimm_fn.runtime.step_contract``.
"""

import contextlib
from collections.abc import Mapping

import torch

from pimm_fn.runtime import step_contract
from pimm_fn.runtime.nonfinite import NonFinite
from pimm_fn.runtime.outputs import device_outputs

__all__ = ["train_step", "train_step_scalars", "scalar_outputs", "runner"]

_DEFAULT = "the default step (no step_fn)"


def _autocast(model, scaler):
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return contextlib.nullcontext()
    device = next((p.device.type for p in model.parameters()), "cpu")
    return torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16)


def _optimize(model, optimizer, batch, scheduler=None, scaler=None, nonfinite=None) -> tuple:
    """The default step's work; returns ``(model outputs, loss, loss value)``.

    The value (a float) is read only under ``"skip"``, before the backward,
    so a skipped batch never reaches the optimizer; else ``None`` (the other
    policies sum the losses on the device: ``NonFinite.watch``).
    """
    optimizer.zero_grad(set_to_none=True)
    try:
        if scaler is None:
            outputs = model(batch)
        else:
            with _autocast(model, scaler):
                outputs = model(batch)
    except TypeError as error:  # torch refusing a (input, target) batch: the contract, not "must be Tensor"
        raise step_contract.forward_refused(error, batch, _DEFAULT)
    if not (outputs.__class__ is dict or isinstance(outputs, Mapping)) or "loss" not in outputs:
        raise step_contract.no_loss(outputs, _DEFAULT)
    loss = outputs["loss"]
    value = None
    if nonfinite is not None:
        if nonfinite.before_backward:
            value = loss.item()
            if not nonfinite.finite(value, loss.device) and not nonfinite(value):
                return outputs, loss, value  # skipped: no backward ran, so the gradients stay zeroed
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return outputs, loss, value


def train_step(model, optimizer, batch, *, scheduler=None, scaler=None) -> Mapping:
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
    return {name: value if value.__class__ is float else float(value.item())
            for name, value in device_outputs(outputs).items()}


def runner(step_fn, read: bool, nonfinite: NonFinite | None = None):
    """``run(model, optimizer, batch, scheduler, scaler) -> outputs`` for ``step_fn``, reading nothing.

    The outputs are the step's numeric scalars as they are, device tensors
    included (``pimm_fn.runtime.outputs``): the loop reads them where a hook
    reads them, at each epoch's end, and every ``WAIT_AT_MOST`` steps. When no hook listens to
    ``AfterStep`` (``read`` False) they are only the loss a ``nonfinite``
    policy checks later (``"raise"``, ``"warn"``); ``"skip"`` has the default
    step read its loss before the backward, and a ``TrainStep`` (the only
    other step ``loop()`` allows it with) is handed the policy
    (``nonfinite=``) to read its loss before the update.
    """
    later = nonfinite is not None and not nonfinite.before_backward  # the loss, read with the outputs
    if step_fn is train_step:
        def run(model, optimizer, batch, scheduler, scaler):
            outputs, loss, value = _optimize(model, optimizer, batch, scheduler, scaler, nonfinite)
            if not read:
                return {"loss": loss.detach()} if later else {}
            lr = optimizer.param_groups[0]["lr"]
            if len(outputs) == 1 and lr.__class__ is float:  # {"loss": loss}, what most models return
                return {"loss": loss.detach() if value is None else value, "lr": lr}
            return device_outputs({**outputs, "loss": loss if value is None else value, "lr": lr})
        return run

    skip = nonfinite if nonfinite is not None and nonfinite.before_backward else None  # a TrainStep's, then

    def run(model, optimizer, batch, scheduler, scaler):
        try:
            if skip is None:
                outputs = step_fn(model, optimizer, batch, scheduler=scheduler, scaler=scaler)
            else:
                outputs = step_fn(model, optimizer, batch, scheduler=scheduler, scaler=scaler, nonfinite=skip)
        except TypeError as error:  # a step whose signature loop() could not read: the contract it broke
            raise step_contract.call_refused(error, step_fn)
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
