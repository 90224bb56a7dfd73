"""The default training step and the conversion of its outputs to numbers."""

import contextlib
from collections.abc import Mapping

import torch

__all__ = ["train_step", "scalar_outputs"]


def _autocast(model, scaler):
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return contextlib.nullcontext()
    device = next((p.device.type for p in model.parameters()), "cpu")
    return torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16)


def train_step(model, optimizer, batch, *, scheduler=None, scaler=None) -> Mapping:
    """One optimizer step on ``batch``: ``loss = model(batch)["loss"]``, backward, step.

    With a ``torch.amp.GradScaler`` the forward runs under autocast and the
    loss is scaled. The scheduler, if any, steps once per call.

    Returns:
        The model's outputs with a detached ``loss`` and the first group's ``lr``.
    """
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
    return {**outputs, "loss": loss.detach(), "lr": optimizer.param_groups[0]["lr"]}


def scalar_outputs(outputs) -> dict:
    """The step's numeric scalars as floats; other outputs (logits) are dropped."""
    if outputs is None:
        return {}
    if not (outputs.__class__ is dict or isinstance(outputs, Mapping)):
        outputs = {"loss": outputs}
    scalars = {}
    for name, value in outputs.items():
        cls = value.__class__
        if cls is float:  # the common cases first: this runs every step
            scalars[name] = value
        elif isinstance(value, torch.Tensor):
            if value.numel() == 1:
                scalars[name] = float(value.detach() if value.requires_grad else value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            scalars[name] = float(value)
    return scalars
