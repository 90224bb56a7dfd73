"""The default training step, the conversion of its outputs to numbers, and a NaN loss.

What the loop does with a non-finite loss is ``loop(training=Training(on_nonfinite=...))``'s
policy, carried by a ``NonFinite`` value:

* ``"raise"`` (the default): ``NonFiniteLossError`` naming the global step
  and the batch of the epoch;
* ``"skip"``: the default step leaves that batch out of the update (no
  backward, no optimizer, scaler or scheduler step: the gradients stay
  zeroed) but the step counts: progress advances and the batch is consumed.
  Refused with a custom ``step_fn``, whose loss is seen only after its step ran;
* ``"warn"``: a ``NonFiniteLossWarning``, and the step goes on as usual.

Each occurrence under ``"skip"``/``"warn"`` is a warning with the count so
far.

``"skip"`` must decide before the backward, so the default step reads the
loss there (``loss.item()``: one host sync per step on GPU) and a custom
``step_fn`` is refused. ``"raise"`` and ``"warn"`` read nothing per step:
the losses wait on their device with the other outputs and are read with
them (``pimm_fn.runtime.outputs``), where a hook reads the outputs and at
each epoch's end (``NonFinite.read``). So the error names the step, comes
before any checkpoint of a later step is written, and finds the weights in
memory already updated from the non-finite loss: resume from the last
checkpoint. With several ranks each read is agreed by one all-reduce of a
flag, so every rank skips, warns or raises alike instead of one rank
leaving a collective.
"""

import contextlib
import math
import warnings
from collections.abc import Mapping

import torch

from pimm_fn.runtime.outputs import device_outputs

__all__ = [
    "train_step", "train_step_scalars", "scalar_outputs", "NonFinite", "NonFiniteLossError", "NonFiniteLossWarning",
    "NONFINITE_POLICIES", "runner",
]

NONFINITE_POLICIES = ("raise", "skip", "warn")


class NonFiniteLossError(FloatingPointError):
    """The training loss is NaN or infinite, under ``loop(training=Training(on_nonfinite="raise"))`` (the default).

    Read after its step ran, so the weights in memory already hold that
    step's update and the losses stay unread: ``run()`` would raise it
    again. ``advice`` is what the run's interruption line says instead of
    "run() continues exactly from here".
    """

    advice = (
        "the weights already hold the update from that loss, so run() would raise this again: build the run anew "
        "from the last checkpoint (pimm_fn.loop(..., resume='auto')) with a lower lr, or with "
        "training=pimm_fn.Training(on_nonfinite='skip') to leave such batches out of the update"
    )


class NonFiniteLossWarning(RuntimeWarning):
    """A NaN or infinite training loss, under ``loop(training=Training(on_nonfinite="skip"))`` or ``"warn"``."""


class NonFinite:
    """The loop's policy for a NaN or infinite loss, and where training stands when one comes.

    Args:
        policy: ``"raise"``, ``"skip"`` or ``"warn"``.
        world_size: ranks that must agree on the decision (one all-reduce a step when > 1).
        where: ``() -> Progress`` before the step being trained (``loop()`` sets it).
    """

    def __init__(self, policy: str = "raise", *, world_size: int = 1, where=None):
        self.policy = policy
        self.world_size = world_size
        self.where = where
        self.count = 0  # occurrences so far in this process

    @property
    def before_backward(self) -> bool:
        """Whether each loss is read before its backward (``"skip"``); else the loop reads them later, in batches."""
        return self.policy == "skip"

    def read(self, losses: list) -> None:
        """Act on the first non-finite of ``losses``, ``[(global step, float)]`` read after their steps ran.

        With several ranks one all-reduce agrees whether any rank saw one
        (every rank reads at the same points).

        Raises:
            NonFiniteLossError: under ``"raise"``, naming the step.
        """
        bad = next(((step, v) for step, v in losses if not math.isfinite(v)), None)
        if self.world_size > 1 and not self._agree(bad is None):
            bad = bad or (losses[-1] if losses else (None, 0.0))
        elif bad is None:
            return
        step, value = bad
        self(value, ran=True, step=step)
        for step, value in losses:  # under "warn": each further one is said too
            if (step, value) != bad and not math.isfinite(value):
                self(value, ran=True, step=step)

    def _agree(self, finite: bool) -> bool:
        """Whether every rank's losses were finite (one all-reduce)."""
        import torch.distributed as td

        device = torch.device("cuda", torch.cuda.current_device()) if td.get_backend() == "nccl" else None
        flag = torch.tensor([0.0 if finite else 1.0], device=device)
        td.all_reduce(flag, op=td.ReduceOp.MAX)
        return flag.item() == 0.0

    def finite(self, value: float, device) -> bool:
        """Whether the loss ``value`` is finite on every rank (one all-reduce with several ranks)."""
        if self.world_size == 1:
            return math.isfinite(value)
        return self._agree(math.isfinite(value))

    def __call__(self, value: float, *, ran: bool = False, step: int | None = None) -> bool:
        """Act on a non-finite loss ``value``; True when the step is to go ahead (``"warn"``).

        ``ran``: the step already ran (a custom ``step_fn``), so nothing can be skipped.
        ``step``: the global step of a loss read after it ran.

        Raises:
            NonFiniteLossError: under ``"raise"``.
        """
        self.count += 1
        p = self.where() if self.where is not None else None
        if step is not None:
            place = f"global step {step} (read where a hook reads the step's outputs, or at the epoch's end)"
        elif p is not None:
            place = f"global step {p.global_step + 1} (batch index {p.iter_in_epoch} of epoch {p.epoch}, counting from 0)"
        else:
            place = "this step"
        which = f"is {value}" if not math.isfinite(value) else f"is not finite on another rank (here {value})"
        if self.policy == "raise":
            raise NonFiniteLossError(
                f"the training loss {which} at {place}. Pass loop(training=pimm_fn.Training(on_nonfinite='skip')) to leave "
                f"such batches out of the update, or on_nonfinite='warn' to warn and go on; "
                f"{NonFiniteLossError.advice}"
            )
        if self.policy == "skip" and not ran:
            action = "its optimizer step was skipped (the step still counts)"
        else:
            action = "the step ran" if ran else "the step goes ahead (on_nonfinite='warn')"
        warnings.warn(
            f"the training loss {which} at {place}: {action}; {self.count} non-finite loss(es) so far",
            NonFiniteLossWarning,
            stacklevel=4,
        )
        return self.policy == "warn" or ran

    def __repr__(self):
        return f"NonFinite({self.policy!r}, world_size={self.world_size})"


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
    reads them, and at each epoch's end. When no hook listens to
    ``AfterStep`` (``read`` False) they are only the loss a ``nonfinite``
    policy checks later (``"raise"``, ``"warn"``); ``"skip"`` has the default
    step read its loss before the backward.
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

    def run(model, optimizer, batch, scheduler, scaler):
        outputs = step_fn(model, optimizer, batch, scheduler=scheduler, scaler=scaler)
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
