"""Quiet steps: trained and counted, not folded one by one, their outputs left unread on the device.

A step is *quiet* when no hook is called for its events (``last_quiet_step``
in ``pimm_fn.core.schedule`` says how far the next stretch goes). The loop
trains it and counts it here; the state takes every counted step at once
(``skip_to``) when it is next read, and the steps' outputs wait, untouched,
until a hook reads outputs, an epoch ends, or ``WAIT_AT_MOST`` steps have
passed (``pimm_fn.runtime.outputs``):
then all of them are read in one transfer, checked for NaN, and handed in
step order to the hooks that accumulate them, exactly as if each had been
read on its own step.
"""

import attrs

from pimm_fn.core.schedule import last_quiet_step, skip_to
from pimm_fn.runtime.outputs import WAIT_AT_MOST, Unread

__all__ = ["QuietSteps"]


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
        if nonfinite is not None and not nonfinite.before_backward:
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
