"""Quiet steps and their outputs: kept on their device until a hook reads them, so no host sync on quiet steps.

Reading a tensor's value (``item()``, ``float()``, ``.cpu()``) makes the
host wait for the device. A step's outputs are read only where a hook that
reads them is called for its ``AfterStep`` (its cadence fires,
``reads_outputs``), at each epoch's end, and at the end of every
``WAIT_AT_MOST``-th step (1 000: one read where an epoch is long and no hook
reads them, so what waits stays bounded and a NaN loss is seen within as
many steps). The outputs of the steps in between wait, untouched, in an
:class:`Unread` batch; at the next read all of them are converted in one
transfer and handed, in step order, to the hooks that accumulate them
(``log_every``'s epoch sums) and to the NaN check, exactly as if each had
been read on its own step: the same floats, added in the same order. A
quiet step does no per-hook work at all.

Quiet steps: trained and counted, not folded one by one, their outputs left unread on the device.

A step is *quiet* when no hook is called for its events (``last_quiet_step``
in ``pimm_fn.core.schedule`` says how far the next stretch goes). The loop
trains it and counts it here; the state takes every counted step at once
(``skip_to``) when it is next read, and the steps' outputs wait, untouched,
until a hook reads outputs, an epoch ends, or ``WAIT_AT_MOST`` steps have
passed (``pimm_fn.runtime.engine.outputs``):
then all of them are read in one transfer, checked for NaN, and handed in
step order to the hooks that accumulate them, exactly as if each had been
read on its own step.
"""

from collections.abc import Mapping

import attrs
import torch

from pimm_fn.core.schedule import last_quiet_step, skip_to

__all__ = [
    "device_outputs",
    "read_now",
    "read_in_place",
    "Unread",
    "WAIT_AT_MOST",
    "QuietSteps",
]


_Tensor = torch.Tensor


# Steps whose outputs may wait unread: each one's (~0.75 KB of host memory, and a tensor on its device) is held until
# read, so a long epoch no hook reads the outputs of is read at the end of every such step (alike on every rank).
WAIT_AT_MOST = 1_000


def device_outputs(outputs) -> dict:
    """The step's numeric scalars, tensors left where they are (detached); other outputs dropped. No sync."""
    if outputs is None:
        return {}
    if not (outputs.__class__ is dict or isinstance(outputs, Mapping)):
        outputs = {"loss": outputs}
    kept: dict[str, float | torch.Tensor] = {}
    for name, value in outputs.items():
        if value.__class__ is float:
            kept[name] = value
        elif isinstance(value, _Tensor):
            if value.numel() == 1 and not value.dtype.is_complex:
                if value.requires_grad:  # kept, it must not hold the step's graph
                    value = value.detach()
                kept[name] = value if not value.ndim else value.reshape(())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            kept[name] = float(value)
    return kept


def read_now(outputs: dict) -> dict[str, float]:
    """One step's ``device_outputs`` as floats, in one transfer: what a hook asking for a value costs."""
    values = iter(_floats([v for v in outputs.values() if v.__class__ is not float]))
    return {k: v if v.__class__ is float else next(values) for k, v in outputs.items()}


def read_in_place(outputs: dict) -> dict[str, float]:
    """``read_now``, the floats also put in ``outputs``: where those wait with the unread ones, they are read once."""
    values = read_now(outputs)
    outputs.update(values)
    return values


class Unread:
    """The outputs of the steps no hook has read yet, in step order, left on their device."""

    def __init__(self):
        self.steps: list = []  # [(global step, outputs)]

    def __bool__(self) -> bool:
        return bool(self.steps)

    def add(self, step: int, outputs: dict) -> None:
        self.steps.append((step, outputs))

    def read(self, current: dict | None = None) -> tuple[list, dict | None]:
        """``([(step, float outputs)], current as floats)``: every waiting output read in one transfer.

        The batch is kept until :meth:`clear`: a reader that fails reads it again.
        """
        if not self.steps and current is not None:  # a step whose hooks read it, nothing else waiting
            return [], read_now(current)
        pending = self.steps + ([(None, current)] if current is not None else [])
        tensors = [v for _, outputs in pending for v in outputs.values() if v.__class__ is not float]
        values = iter(_floats(tensors))
        read = [
            (step, {k: v if v.__class__ is float else next(values) for k, v in outputs.items()})
            for step, outputs in pending
        ]
        if current is not None:
            return read[:-1], read[-1][1]
        return read, None

    def clear(self) -> None:
        self.steps = []


def _floats(tensors: list) -> list:
    """The values of 0-dimensional ``tensors`` as floats, each exactly as its ``item()``: one transfer per dtype and device."""
    if len(tensors) == 1:
        return [float(tensors[0].item())]
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    values = [0.0] * len(tensors)
    for indices in groups.values():
        for i, v in zip(indices, torch.stack([tensors[i] for i in indices]).tolist()):
            values[i] = float(v)
    return values


class QuietSteps:
    """The quiet steps a ``Loop`` trained since its state last took them, and their unread outputs.

    One per ``Loop``, owned by its ``Walker`` and changed through these
    methods (and ``until``, below). It is a small mutable record rather than
    a frozen value because it changes on every quiet step, where building a
    value would be the step's largest cost.

    Attributes:
        until: the last step that may be trained quietly (0: the next step is walked; the walker
            sets 0 whenever it replaces its state, so the next step opens the next stretch).
        last: the last quiet step trained since the state took them, or ``None``.
        samples: the samples of those steps, in all.
        unread: their outputs, and those of walked steps no hook read, on their device.
    """

    __slots__ = ("until", "last", "samples", "unread")

    def __init__(self):
        self.until = 0
        self.last = None
        self.samples = 0
        self.unread = Unread()

    def count(self, step: int, size: int, outputs: dict) -> None:
        """Count quiet ``step`` of ``size`` samples; its ``outputs`` wait unread."""
        if outputs:
            self.unread.steps.append((step, outputs))  # Unread.add, inlined: every quiet step counts here
        self.last = step
        self.samples += size

    def taken(self, state):
        """``state`` with the counted steps in it (``skip_to``); they are no longer counted here."""
        state = skip_to(state, self.last, samples=self.samples)
        self.last, self.samples = None, 0
        return state

    def due(self, step: int) -> bool:
        """Whether the outputs waiting are read at the end of ``step``: every ``WAIT_AT_MOST``-th, when some wait."""
        return not step % WAIT_AT_MOST and bool(self.unread.steps)

    def open(self, hooks, progress) -> None:
        """Where a step begins that no hook wants, the steps up to the next one a hook is called for are quiet."""
        self.until = last_quiet_step(hooks, progress)

    def read(self, step: int | None, outputs, nonfinite) -> tuple[list, dict | None]:
        """``(waiting outputs, outputs)`` as floats, read in one transfer, the NaN check done on them.

        ``outputs`` are those of ``step``'s ``AfterStep``, read with the
        waiting ones (``None``: only the waiting ones). Nothing is forgotten
        until :meth:`accumulated`: a NaN under ``"raise"`` raises again on a retry.
        """
        pending, current = self.unread.read(outputs)
        if nonfinite is not None and not nonfinite.before_update:
            losses = [(s, o["loss"]) for s, o in pending if "loss" in o] if pending else []
            if current is not None and "loss" in current:
                losses.append((step, current["loss"]))
            nonfinite.read(losses)
        return pending, current

    def accumulated(self, state, hooks, pending: list):
        """``state`` after the accumulating hooks took the ``pending`` outputs, in step order; nothing waits then."""
        if not pending:  # only the step's own outputs were read: nothing waited
            return state
        slots = state.slots
        if hooks._accumulators:
            steps = [outputs for _, outputs in pending if outputs]
            if steps:  # each accumulating hook takes them all in one call (``accumulate_all``), where it can
                slots = hooks._accumulate_all(slots, steps)
        self.unread.clear()
        return state if slots is state.slots else attrs.evolve(state, slots=slots)
