"""Where, around ``optimizer.step()``, a train step raised: the one thing that decides whether its retry is exact.

``StepWatch`` registers step hooks on the optimizer that count its step
entries and completions: an exception before ``optimizer.step()`` changed
anything leaves a step whose retry is exact; inside it some parameters may
have changed, and after it (still in the train step) they all have, so the
retry from the same batch is not exact, and ``warn_if_not_exact`` says so
(``ResumeNotExactWarning``). From the step's entry on, a Ctrl-C is held back
(``pimm_fn.runtime.ctrl_c``) until the loop has recorded the step.
"""

import warnings
import weakref
from collections.abc import Mapping

from pimm_fn.runtime.ctrl_c import CTRL_C
from pimm_fn.runtime.resume_warning import ResumeNotExactWarning
from pimm_fn.runtime.transaction import TRAINING

__all__ = ["StepWatch", "warn_if_not_exact", "OPTIMIZING", "AFTER_OPTIMIZER"]

OPTIMIZING = "the optimizer step"
AFTER_OPTIMIZER = "the train step, after the optimizer step"


def warn_if_not_exact(step: int, phase: str) -> None:
    """Warn (``ResumeNotExactWarning``) when a train step raised once ``optimizer.step()`` had begun."""
    if phase is OPTIMIZING or phase is AFTER_OPTIMIZER:
        where = "inside optimizer.step()" if phase is OPTIMIZING else "after optimizer.step() in the train step"
        warnings.warn(
            f"step {step} was interrupted {where}: some parameters may already be updated, so training it "
            f"again from its batch (what run() does) will not end bit-identical to an uninterrupted run",
            ResumeNotExactWarning,
            stacklevel=4,
        )


class StepWatch:
    """Counts the optimizer's step entries and completions, to place an exception around ``optimizer.step()``.

    The pre-hook is kept the last of the optimizer's step pre-hooks (a hook
    registered later is moved before it at the next ``arm``), so that its
    count means every pre-hook passed and the step's body began. One watch
    per optimizer: loops rebuilt around it (``Loop.replace``) share it.
    """

    _watches = weakref.WeakKeyDictionary()

    def __init__(self, optimizer):
        self.entered = 0
        self.done = 0
        self.armed = 0  # the completions when the last step was armed
        self._pre_hooks = optimizer._optimizer_step_pre_hooks
        self._pre = optimizer.register_step_pre_hook(self._entering)
        self._post = optimizer.register_step_post_hook(self._stepped)

    @classmethod
    def of(cls, optimizer) -> "StepWatch | None":
        """The watch of ``optimizer``, made on first use; ``None`` for an optimizer without step hooks.

        For a mapping of named optimizers (``loop(optimizer={name: opt})``), one watch over all of them.
        """
        if isinstance(optimizer, Mapping):
            watches = [cls.of(o) for o in optimizer.values()]
            return None if not watches or None in watches else _Watches(watches)
        if not hasattr(optimizer, "_optimizer_step_pre_hooks") or not hasattr(optimizer, "register_step_post_hook"):
            return None
        try:
            watch = cls._watches.get(optimizer)
        except TypeError:  # not weakly referenceable
            return None
        if watch is None:
            watch = cls._watches[optimizer] = cls(optimizer)
        return watch

    def _entering(self, optimizer, args, kwargs):
        self.entered += 1
        # A Ctrl-C waits for the parameters to be all updated and the step recorded; the next
        # piece of work the loop opens (CtrlC.start) releases it.
        CTRL_C.holding = True

    def _stepped(self, optimizer, args, kwargs):
        self.done += 1

    def arm(self) -> int:
        """Before a step: keep the pre-hook last; returns the completions so far, for ``phase``."""
        hooks = self._pre_hooks
        if next(reversed(hooks)) != self._pre.id:
            hooks.move_to_end(self._pre.id)
        self.armed = self.done
        return self.done

    def phase(self, done_before: int) -> str:
        """Where, around ``optimizer.step()``, a step armed at ``done_before`` raised."""
        entered, self.entered = self.entered, self.done
        if self.done > done_before:
            return AFTER_OPTIMIZER
        return OPTIMIZING if entered > self.done else TRAINING

    def stopped(self, step: int, error: BaseException) -> str:
        """The phase the train step of ``step``, armed last, raised in; warned when its retry is not exact."""
        phase = self.phase(self.armed)
        warn_if_not_exact(step, phase)
        return phase


class _Watches:
    """The watches of several optimizers, read as one: a step raised after any of them stepped is not exact."""

    def __init__(self, watches):
        self.watches = tuple(watches)
        self.armed = 0

    def arm(self) -> int:
        self.armed = sum(w.arm() for w in self.watches)
        return self.armed

    stopped = StepWatch.stopped

    def phase(self, done_before: int) -> str:
        inside = False
        for w in self.watches:
            inside |= w.entered > w.done
            w.entered = w.done
        if sum(w.done for w in self.watches) > done_before:
            return AFTER_OPTIMIZER
        return OPTIMIZING if inside else TRAINING
