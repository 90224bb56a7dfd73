"""``TrainStep``: the training step you configure instead of rewriting.

    run = pf.loop(model, optimizer, data, max_epochs=10,
                  step_fn=pf.TrainStep(device="cuda", precision="bf16", accumulate=4, clip_grad_norm=1.0))

One call is one optimizer step, in this order: batches moved to ``device``;
for each micro-batch a forward under autocast (``precision``) and a
backward of ``loss / k`` (gradient sync between ranks only on the last
one); the gradients unscaled (fp16) and clipped; the optimizer, scaler and
scheduler stepped once. The model computes its loss as for the default
step: ``model(batch)`` returns a mapping with a ``"loss"``.

Accumulation is handed its micro-batches by the loop: with
``accumulate=k`` the feed draws ``k`` batches per step and gives them as
one ``MicroBatches``, so ``global_step`` counts optimizer steps and a
checkpoint, written between steps, never falls inside an accumulation:
resume is exact by construction. ``iters_per_epoch`` counts optimizer
steps (default ``len(data) // k``); the last ``len(data) % k`` batches of
an epoch are left out, as ``drop_last`` does.

Precision and the scaler: ``"fp16"`` scales the loss with a ``GradScaler``
the loop makes (``new_scaler``) and checkpoints like ``loop(training=Training(scaler=))``; a
scaler passed to ``loop`` is used instead. ``"32"`` and ``"bf16"`` need
no scaler, and one passed to ``loop`` is refused: it would say fp16 while
the step computes in another precision.
"""

import contextlib
from collections.abc import Mapping
from typing import ClassVar

import attrs
import torch

from pimm_fn.core.validate import int_at_least, is_bool, number, one_of, optional
from pimm_fn.runtime.batch_to_device import to_device
from pimm_fn.runtime.batches import MicroBatches

__all__ = ["TrainStep", "loop_scaler", "PRECISIONS"]

PRECISIONS = {"32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _device_name(value):
    """``device=`` as the string torch spells it (``"cuda:0"``), so the step's repr and pickle stay plain."""
    if value is None:
        return None
    try:
        return str(torch.device(value))
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"TrainStep: 'device' must be None, a device string or a torch.device (got {value!r})") from None


_clip = optional(number(above=0))  # a finite norm or value to clip to


def _gradient_sync(model, sync: bool):
    """A context in which ``model`` all-reduces gradients in backward only when ``sync``.

    FSDP2 models are told with ``set_requires_gradient_sync``; DDP (and
    FSDP1) skip it inside ``no_sync()``; a model of one process has none.
    """
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if not sync and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def _parameters(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def _total_norm(parameters) -> torch.Tensor:
    """The 2-norm of all the gradients together, as ``clip_grad_norm_`` measures it."""
    grads = [p.grad for p in parameters]
    if hasattr(torch.nn.utils, "get_total_norm"):
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


@attrs.frozen(kw_only=True, repr=False)
class TrainStep:
    """A training step set by its options: device, precision, accumulation, clipping.

    Called as any ``step_fn``: ``step(model, optimizer, batch, *,
    scheduler=None, scaler=None)``, one optimizer step per call.

    Args:
        device: where batches go (``"cuda"``, ``"cuda:1"``, a ``torch.device``),
            moved with ``non_blocking=True``; ``None`` leaves them where they
            are. The model is not moved: put it there before ``loop``.
        precision: ``"32"`` (no autocast), ``"bf16"`` or ``"fp16"``: the
            forward runs under ``torch.autocast`` to that dtype, on the
            device's type (bf16 works on CPU too).
        accumulate: micro-batches per optimizer step (``k >= 1``): each
            backward takes ``loss / k``, and a model in DDP or FSDP syncs
            gradients only on the last. The loop feeds ``k`` batches a step.
        clip_grad_norm: clip the gradients' total 2-norm to this (``> 0``).
        clip_grad_value: clip each gradient element to ``[-v, v]``. Not both.
        grad_scaler: with ``"fp16"``, scale the loss with a ``GradScaler``
            (default ``True``); ignored otherwise.

    Returns (of a call):
        ``{"loss", "grad_norm" (when clipping: the total norm before
        clipping), "lr", ...}``: the model's other one-element outputs
        too. Tensors stay detached on the device (the step reads no value):
        each scalar is the mean over the micro-batches; other outputs are the
        last micro-batch's.

    Raises:
        ValueError: at construction, for an option outside what is allowed
            (each message names the option, what it accepts and the value).
    """

    factory_name: ClassVar[str] = "TrainStep"
    device: str | None = attrs.field(default=None, converter=_device_name)
    precision: str = attrs.field(default="32", validator=one_of(*PRECISIONS))
    accumulate: int = attrs.field(default=1, validator=int_at_least(1))
    clip_grad_norm: float | None = attrs.field(default=None, validator=_clip)
    clip_grad_value: float | None = attrs.field(default=None, validator=_clip)
    grad_scaler: bool = attrs.field(default=True, validator=is_bool)

    def __attrs_post_init__(self):
        if self.clip_grad_norm is not None and self.clip_grad_value is not None:
            raise ValueError(
                f"TrainStep: pass clip_grad_norm or clip_grad_value, not both "
                f"(got clip_grad_norm={self.clip_grad_norm!r}, clip_grad_value={self.clip_grad_value!r})"
            )

    def __repr__(self):
        """The call that builds this step, with the options that differ from the defaults."""
        options = [f"{f.name}={getattr(self, f.name)!r}" for f in attrs.fields(type(self))
                   if getattr(self, f.name) != f.default]
        return f"TrainStep({', '.join(options)})"

    def device_type(self, model) -> str:
        """The device type autocast and the scaler work on: ``device``'s, else the model's parameters'."""
        if self.device is not None:
            return torch.device(self.device).type
        return next((p.device.type for p in model.parameters()), "cpu")

    def new_scaler(self, model):
        """The ``GradScaler`` this step needs (``"fp16"`` with ``grad_scaler``), else ``None``."""
        if self.precision != "fp16" or not self.grad_scaler:
            return None
        return torch.amp.GradScaler(self.device_type(model))

    def check_scaler(self, scaler) -> None:
        """Refuse an enabled scaler under ``"32"``/``"bf16"``: it would scale a loss no fp16 forward made."""
        if scaler is not None and self.precision != "fp16" and getattr(scaler, "is_enabled", lambda: True)():
            raise ValueError(
                f"{self!r} got a GradScaler, which is for fp16: use TrainStep(precision='fp16') "
                f"(it makes its own scaler) or leave loop(training=pimm_fn.Training(scaler=None))"
            )

    def __call__(self, model, optimizer, batch, *, scheduler=None, scaler=None) -> dict:
        """One optimizer step over ``batch`` (its micro-batches under ``accumulate``)."""
        self.check_scaler(scaler)
        if self.precision == "fp16" and self.grad_scaler and scaler is None:
            raise ValueError(
                f"{self!r} needs a GradScaler: loop(step_fn=...) makes it; calling the step yourself, pass "
                f"scaler=step.new_scaler(model) (or TrainStep(..., grad_scaler=False))"
            )
        parts = self._micro_batches(batch)
        optimizer.zero_grad(set_to_none=True)
        outputs = self._backward(model, parts, scaler)
        grad_norm = self._clip(optimizer, scaler)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if grad_norm is not None:
            outputs["grad_norm"] = grad_norm.detach()
        outputs["lr"] = optimizer.param_groups[0]["lr"]
        return outputs

    def _micro_batches(self, batch) -> tuple:
        """The micro-batches of one step: the feed's ``MicroBatches`` under ``accumulate``, else ``(batch,)``."""
        if self.accumulate == 1:
            return (batch,)
        if not isinstance(batch, MicroBatches) or not batch:
            raise TypeError(
                f"{self!r} takes the micro-batches of one optimizer step as a MicroBatches, which the loop's "
                f"feed gives when step_fn has accumulate > 1 (got {type(batch).__name__}); calling the step "
                f"yourself, pass MicroBatches([batch_1, ..., batch_{self.accumulate}])"
            )
        return batch

    def _forward(self, model, batch, device_type: str) -> Mapping:
        dtype = PRECISIONS[self.precision]
        context = torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with context:
            outputs = model(batch)
        if not isinstance(outputs, Mapping) or "loss" not in outputs:
            raise TypeError(
                f"{self!r} expects model(batch) to return a mapping with a 'loss' entry "
                f"(got {type(outputs).__name__}); return {{'loss': loss, ...}}"
            )
        return outputs

    def _backward(self, model, parts, scaler) -> dict:
        """Forward and backward each micro-batch; returns the outputs averaged over them."""
        device_type = self.device_type(model)
        k = len(parts)
        sums, outputs = {}, {}
        for i, part in enumerate(parts):
            last = i == k - 1
            with _gradient_sync(model, last) if k > 1 else contextlib.nullcontext():
                if self.device is not None:
                    part = to_device(part, self.device)
                outputs = self._forward(model, part, device_type)
                loss = outputs["loss"] / k if k > 1 else outputs["loss"]
                (scaler.scale(loss) if scaler is not None else loss).backward()
            _add_scalars(sums, outputs)
        mean = {name: total / k if k > 1 else total for name, total in sums.items()}
        return {**outputs, **mean}

    def _clip(self, optimizer, scaler):
        """Clip the gradients as configured; returns their total norm before clipping (``None`` unclipped)."""
        if self.clip_grad_norm is None and self.clip_grad_value is None:
            return None
        if scaler is not None:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        parameters = _parameters(optimizer)
        if self.clip_grad_norm is not None:
            return torch.nn.utils.clip_grad_norm_(parameters, self.clip_grad_norm)
        norm = _total_norm(parameters)
        torch.nn.utils.clip_grad_value_(parameters, self.clip_grad_value)
        return norm


def _add_scalars(sums: dict, outputs: Mapping) -> None:
    """Add ``outputs``' one-element tensors (detached) and numbers into ``sums``, on the device."""
    for name, value in outputs.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            value = value.detach()
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        sums[name] = sums[name] + value if name in sums else value


def loop_scaler(step_fn, scaler, model):
    """The scaler ``loop`` checkpoints and hands ``step_fn``: ``scaler``, else the one the step makes.

    A step without ``new_scaler`` (the default step, a function) takes
    ``scaler`` as it is; a ``TrainStep`` refuses one it has no use for.
    """
    if not isinstance(step_fn, TrainStep):
        return scaler
    if scaler is None:
        return step_fn.new_scaler(model)
    step_fn.check_scaler(scaler)
    return scaler
