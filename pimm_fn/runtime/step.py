"""The default training step and the conversion of its outputs to numbers."""

import contextlib
from collections.abc import Mapping

import torch

__all__ = ["train_step", "train_step_scalars", "scalar_outputs"]


def _autocast(model, scaler):
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return contextlib.nullcontext()
    device = next((p.device.type for p in model.parameters()), "cpu")
    return torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16)


def _optimize(model, optimizer, batch, scheduler=None, scaler=None) -> tuple:
    """The default step's work; returns ``(model outputs, loss)``."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        outputs = model(batch)
    else:
        with _autocast(model, scaler):
            outputs = model(batch)
    if not (outputs.__class__ is dict or isinstance(outputs, Mapping)) or "loss" not in outputs:
        raise TypeError(
            f"the default step expects model(batch) to return a mapping with a 'loss' entry "
            f"(got {type(outputs).__name__}); return {{'loss': loss, ...}} or pass step_fn= to loop()"
        )
    loss = outputs["loss"]
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return outputs, loss


def train_step(model, optimizer, batch, *, scheduler=None, scaler=None) -> Mapping:
    """One optimizer step on ``batch``: ``loss = model(batch)["loss"]``, backward, step.

    With a ``torch.amp.GradScaler`` the forward runs under autocast and the
    loss is scaled. The scheduler, if any, steps once per call; the loop
    passes ``scheduler=None`` when a hook steps it (``step_scheduler``).

    Returns:
        The model's outputs with a detached ``loss`` and the first group's ``lr``.
    """
    outputs, loss = _optimize(model, optimizer, batch, scheduler, scaler)
    return {**outputs, "loss": loss.detach(), "lr": optimizer.param_groups[0]["lr"]}


def train_step_scalars(model, optimizer, batch, scheduler=None, scaler=None) -> dict:
    """``scalar_outputs(train_step(...))``, the loop's default step when hooks read the outputs.

    Equal to the two calls, in value and key order, without building the
    intermediate dict or detaching the loss (``item()`` reads it directly).
    """
    outputs, loss = _optimize(model, optimizer, batch, scheduler, scaler)
    lr = optimizer.param_groups[0]["lr"]
    if len(outputs) == 1 and loss.__class__ is torch.Tensor and lr.__class__ is float:
        # {"loss": loss}, what most models return; backward() took it, so it is one float element.
        return {"loss": loss.item(), "lr": lr}
    return scalar_outputs({**outputs, "lr": lr})


def _scalar(value):
    """``value`` as a float when it is a numeric scalar (a one-element tensor included), else ``None``."""
    if isinstance(value, torch.Tensor):
        if value.numel() == 1:
            value = value.item()  # no detach needed, and no autograd warning: item() reads the value
            return value if value.__class__ is float else float(value)
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def scalar_outputs(outputs) -> dict:
    """The step's numeric scalars as floats; other outputs (logits) are dropped."""
    if outputs is None:
        return {}
    if not (outputs.__class__ is dict or isinstance(outputs, Mapping)):
        outputs = {"loss": outputs}
    scalars = {}
    for name, value in outputs.items():
        if value.__class__ is float:  # the common case first: this runs every step
            scalars[name] = value
        elif (value := _scalar(value)) is not None:
            scalars[name] = value
    return scalars
