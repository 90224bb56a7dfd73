"""``TrainStep``: the training step you configure instead of rewriting.

    run = pf.loop(model, optimizer, data, max_epochs=10,
                  step_fn=pf.TrainStep(device="cuda", precision="bf16", accumulate=4, clip_grad_norm=1.0))

One call is one optimizer step, in this order: batches moved to ``device``;
for each micro-batch a forward under autocast (``precision``) and a
backward of ``loss / k`` (gradient sync between ranks only on the last
one); the gradients unscaled (fp16) and clipped; the optimizer, scaler and
scheduler stepped once. The loss is the default step's, ``model(batch)``
returning a mapping with a ``"loss"``; or, with ``loss_fn`` (the supervised
step, Ignite's ``create_supervised_trainer``), ``loss_fn(model(input),
target)`` of ``(input, target)`` batches (``pimm_fn.runtime.step.train_step``).

Under ``loop(training=Training(on_nonfinite="skip"))`` the loop hands the
step its ``NonFinite`` policy: after the backward, before the gradients are
unscaled or clipped, the step's loss is read (one host sync a step; with
several ranks one all-reduce agrees on it), and a NaN or infinite one
leaves the update out: the gradients are zeroed, and neither the optimizer,
the scaler nor the scheduler steps, as the default step skips.

Under ``Parallel(fault_tolerant=...)`` the loop hands the step the replica
groups' vote (``commit=``), which it casts after the backward (and the
``"skip"`` check), before the gradients are unscaled or clipped: every
group then unscales, clips and steps the same averaged gradients
(``pimm_fn.runtime.replicas.commit``). A failed vote steps nothing.

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
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs
import torch

from pimm_fn.core.validate import int_at_least, is_bool, is_callable, number, one_of, optional
from pimm_fn.runtime.step import train_step as step_contract
from pimm_fn.runtime.step.driver import MicroBatches
from pimm_fn.runtime.step.train_step import to_device, train_step

__all__ = ["TrainStep", "loop_scaler", "built_in", "PRECISIONS"]

PRECISIONS = {"32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _device_name(value):
    """``device=`` as the string torch spells it (``"cuda:0"``), so the step's repr and pickle stay plain."""
    if value is None:
        return None
    try:
        return str(torch.device(value))
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"TrainStep: 'device' must be None, a device string or a torch.device (got {value!r})"
        ) from None


_clip = optional(number(above=0))  # a finite norm or value to clip to


def _keys(value):
    """``keys=`` as a tuple (a list reads as one), so the step compares and hashes by value."""
    return tuple(value) if isinstance(value, list) else value


def _two_names(instance, attribute, value) -> None:
    if value is None:
        return
    if not (isinstance(value, tuple) and len(value) == 2 and all(isinstance(k, str) and k for k in value)):
        raise ValueError(
            f"TrainStep: 'keys' must be None or (input_key, target_key), two non-empty str (got {value!r:.80})"
        )


def _name(fn) -> str:
    """A loss function as the call that makes it reads: ``cross_entropy``, ``CrossEntropyLoss()``."""
    return fn.__qualname__ if hasattr(fn, "__qualname__") else repr(fn)


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
    """A training step set by its options: the loss, device, precision, accumulation, clipping.

    Called as any ``step_fn``: ``step(model, optimizer, batch, *,
    scheduler=None, scaler=None)``, one optimizer step per call.

    Attributes:
        loss_fn: the supervised step: batches are ``(input, target)`` (a
            tuple or list of two, or a mapping, see ``keys``) and the step
            trains on ``loss_fn(model(input), target)``, a one-element tensor
            (``torch.nn.functional.cross_entropy``, ``torch.nn.MSELoss()``).
            ``None`` (default): ``model(batch)`` with the whole batch returns
            ``{"loss": loss, ...}``, as for the default step.
        keys: with ``loss_fn``, where a mapping batch holds the input and the
            target, ``(input_key, target_key)``; ``None`` takes the first of
            ``"input"``, ``"inputs"``, ``"x"`` and of ``"target"``,
            ``"targets"``, ``"label"``, ``"labels"``, ``"y"`` it holds.
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
        clipping), "lr", ...}``: without ``loss_fn``, the model's other
        one-element outputs too. Tensors stay detached on the device (the
        step reads no value):
        each scalar is the mean over the micro-batches; other outputs are the
        last micro-batch's.

    Raises:
        ValueError: at construction, for an option outside what is allowed
            (each message names the option, what it accepts and the value).
        TypeError: (of a call) a batch or a model output the step cannot use,
            naming the contract and the fix (``pimm_fn.runtime.step.train_step``).
    """

    factory_name: ClassVar[str] = "TrainStep"
    loss_fn: Callable[..., Any] | None = attrs.field(
        default=None,
        validator=optional(
            is_callable.with_hint("pass loss_fn(output, target) -> loss, e.g. torch.nn.functional.cross_entropy")
        ),
    )
    keys: tuple | None = attrs.field(default=None, converter=_keys, validator=_two_names)
    device: str | None = attrs.field(default=None, converter=_device_name)
    precision: str = attrs.field(default="32", validator=one_of(*PRECISIONS))
    accumulate: int = attrs.field(default=1, validator=int_at_least(1))
    clip_grad_norm: float | None = attrs.field(default=None, validator=_clip)
    clip_grad_value: float | None = attrs.field(default=None, validator=_clip)
    grad_scaler: bool = attrs.field(default=True, validator=is_bool)

    def __attrs_post_init__(self):
        if self.keys is not None and self.loss_fn is None:
            raise ValueError(
                f"TrainStep: keys={self.keys!r} name the input and target of a supervised step: pass "
                f"loss_fn= too (TrainStep(loss_fn=..., keys={self.keys!r}))"
            )
        if self.clip_grad_norm is not None and self.clip_grad_value is not None:
            raise ValueError(
                f"TrainStep: pass clip_grad_norm or clip_grad_value, not both "
                f"(got clip_grad_norm={self.clip_grad_norm!r}, clip_grad_value={self.clip_grad_value!r})"
            )

    def __repr__(self):
        """The call that builds this step, with the options that differ from the defaults."""
        options = [
            f"{f.name}={_name(value) if f.name == 'loss_fn' else repr(value)}"
            for f in attrs.fields(type(self))
            if (value := getattr(self, f.name)) != f.default
        ]
        return f"TrainStep({', '.join(options)})"

    def device_type(self, model: torch.nn.Module) -> str:
        """The device type autocast and the scaler work on: ``device``'s, else the model's parameters'."""
        if self.device is not None:
            return torch.device(self.device).type
        return next((p.device.type for p in model.parameters()), "cpu")

    def new_scaler(self, model: torch.nn.Module) -> torch.amp.GradScaler | None:
        """The ``GradScaler`` this step needs (``"fp16"`` with ``grad_scaler``), else ``None``."""
        if self.precision != "fp16" or not self.grad_scaler:
            return None
        return torch.amp.GradScaler(self.device_type(model))

    def check_scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        """Refuse an enabled scaler under ``"32"``/``"bf16"``: it would scale a loss no fp16 forward made."""
        if scaler is not None and self.precision != "fp16" and getattr(scaler, "is_enabled", lambda: True)():
            raise ValueError(
                f"{self!r} got a GradScaler, which is for fp16: use TrainStep(precision='fp16') "
                f"(it makes its own scaler) or leave loop(training=pimm_fn.Training(scaler=None))"
            )

    def __call__(self, model, optimizer, batch, *, scheduler=None, scaler=None, nonfinite=None, commit=None) -> dict:
        """One optimizer step over ``batch`` (its micro-batches under ``accumulate``).

        ``nonfinite``: the loop's ``NonFinite`` policy under ``"skip"``, which
        leaves the update of a NaN or infinite loss out (the module docstring),
        or under any policy for replica groups, which decide before the update.
        ``commit``: under ``FaultTolerance``, ``() -> bool``, the replica
        groups' vote on the gradients; False leaves the update out.
        """
        self.check_scaler(scaler)
        if self.precision == "fp16" and self.grad_scaler and scaler is None:
            raise ValueError(
                f"{self!r} needs a GradScaler: loop(step_fn=...) makes it; calling the step yourself, pass "
                f"scaler=step.new_scaler(model) (or TrainStep(..., grad_scaler=False))"
            )
        parts = self._micro_batches(batch)
        optimizer.zero_grad(set_to_none=True)
        outputs = self._backward(model, parts, scaler)
        if nonfinite is not None and self._skipped(outputs, nonfinite):
            optimizer.zero_grad(set_to_none=True)  # no optimizer, scaler or scheduler step: the update is left out
            outputs["lr"] = optimizer.param_groups[0]["lr"]
            return outputs
        if commit is not None and not commit():  # not committed: the gradients are dropped, nothing steps
            outputs["lr"] = optimizer.param_groups[0]["lr"]
            return outputs
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

    @staticmethod
    def _skipped(outputs: dict, nonfinite) -> bool:
        """Whether the step's loss (read here, agreed by every rank) is NaN or infinite and its update left out."""
        loss = outputs["loss"]
        value = float(loss.item()) if isinstance(loss, torch.Tensor) else float(loss)
        if nonfinite.finite(value, None) or nonfinite(value):
            return False
        outputs["loss"] = value
        return True

    def _forward(self, model, batch, device_type: str | None) -> Mapping:
        """The model's outputs on ``batch`` (its loss under ``loss_fn``), under autocast on ``device_type`` if any."""
        if device_type is None:  # full precision: no autocast to enter
            return self._outputs(model, batch)
        with torch.autocast(device_type, dtype=PRECISIONS[self.precision]):
            return self._outputs(model, batch)

    def _outputs(self, model, batch) -> Mapping:
        if self.loss_fn is not None:
            inputs, target = step_contract.supervised(batch, self.keys, self)
            return {"loss": step_contract.check_loss(self.loss_fn(model(inputs), target), self)}
        try:
            outputs = model(batch)
        except TypeError as error:
            raise step_contract.forward_refused(error, batch, self)
        if not isinstance(outputs, Mapping) or "loss" not in outputs:
            raise step_contract.no_loss(outputs, self)
        return outputs

    def _backward(self, model, parts, scaler) -> dict:
        """Forward and backward each micro-batch; returns the outputs averaged over them."""
        # Autocast's device, looked up (over the model's parameters) only under a precision that autocasts.
        device_type = self.device_type(model) if PRECISIONS[self.precision] is not None else None
        k = len(parts)
        if k == 1:  # one batch: no gradient sync to hold back, nothing to average
            outputs = self._backward_one(model, parts[0], device_type, scaler, 1)
            if self.loss_fn is not None:  # {"loss": loss}, one element (check_loss): detached, all there is
                return {"loss": outputs["loss"].detach()}
            scalars: dict[str, Any] = {}
            _add_scalars(scalars, outputs)
            return {**outputs, **scalars}
        sums: dict[str, Any] = {}  # tensors on the device, or numbers
        for i, part in enumerate(parts):
            with _gradient_sync(model, i == k - 1):
                outputs = self._backward_one(model, part, device_type, scaler, k)
            _add_scalars(sums, outputs)
        return {**outputs, **{name: total / k for name, total in sums.items()}}

    def _backward_one(self, model, part, device_type: str | None, scaler, k: int) -> Mapping:
        """The forward and backward of one of ``k`` micro-batches (its loss over ``k``); returns its outputs."""
        if self.device is not None:
            part = to_device(part, self.device)
        outputs = self._forward(model, part, device_type)
        loss = outputs["loss"] / k if k > 1 else outputs["loss"]
        (scaler.scale(loss) if scaler is not None else loss).backward()
        return outputs

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


def built_in(step_fn) -> bool:
    """Whether ``step_fn`` is one of the library's steps (``None``, the default, or a ``TrainStep``).

    A built-in step trains one optimizer and can leave a NaN loss's update
    out (``on_nonfinite="skip"``); a custom one has stepped its optimizer by
    the time the loop sees its loss.
    """
    return step_fn is None or step_fn is train_step or isinstance(step_fn, TrainStep)


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
