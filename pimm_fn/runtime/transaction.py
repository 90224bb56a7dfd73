"""A training step as a transaction: where an interrupted step stopped, and what it can retry exactly.

An exception or KeyboardInterrupt anywhere in a step (the fetch, forward,
backward, optimizer or scheduler step, a hook, an effect handler) leaves the
loop at a point ``run()`` continues from to the same weights and trace as an
uninterrupted run. This module holds what the loop needs for that beyond
the core's resumable ``process`` (``pimm_fn.core.fold.Pending``):

* ``Interruption``, the public value ``Loop.interrupted`` shows and the line
  the loop prints;
* ``StepWatch``, optimizer step hooks that tell whether an exception came
  before ``optimizer.step()`` changed anything (the retry is exact), inside
  it (some parameters may have changed: not exact, and said so), or after;
* ``failing_hook``, the hook a fold raised in, read from the traceback so
  the fold itself pays nothing for it.

Across ranks (a process group of two or more), see ``pimm_fn.runtime.peers``:
a step that fails on every rank at the same global step and in the same
phase (a deterministic bug in a hook or an effect handler) leaves every rank
at a point ``run()`` continues from exactly, as in one process. A step that
fails on some ranks only, or in different places, never hangs the others:
the process group is shut down, every rank raises within seconds (the ranks
that did not fail with ``PeerFailureError`` naming the rank that did), and
``interrupted.continues`` is False: the run must be rebuilt on every rank,
in a fresh process group, with ``resume="auto"``.
"""

import warnings
import weakref
from collections.abc import Mapping

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.runtime.ctrl_c import CTRL_C
from pimm_fn.runtime.feed import ResumeNotExactWarning

__all__ = ["Interruption", "StepWatch", "failing_hook", "effect_phase"]

LOADING = "loading the batch"
TRAINING = "the train step"
OPTIMIZING = "the optimizer step"
AFTER_OPTIMIZER = "the train step, after the optimizer step"
SCHEDULING = "the scheduler step"


@attrs.frozen
class Interruption:
    """Where a step stopped: global ``step`` and the ``phase`` that raised.

    ``phase`` is one of ``"loading the batch"``, ``"the train step"``,
    ``"the optimizer step"``, ``"the scheduler step"``, ``"hook <identity>"``
    or ``"effect <Effect>"``.

    >>> print(Interruption(15, "effect Evaluate(step=15, evaluator='val')"))
    interrupted at step 15 during effect Evaluate(step=15, evaluator='val'); run() continues exactly from here
    """

    step: int
    phase: str
    continues: bool = True

    def __str__(self) -> str:
        where = f"interrupted at step {self.step} during {self.phase}"
        if self.continues:
            return f"{where}; run() continues exactly from here"
        return (
            f"{where}; the ranks did not fail alike, so the process group was shut down: rebuild the run on every "
            f'rank in a fresh process group with resume="auto"'
        )


def effect_phase(effect) -> str:
    """``"effect <repr>"``, cut to a console line's length."""
    shown = repr(effect)
    return f"effect {shown if len(shown) <= 100 else shown[:97] + '...'}"


def failing_hook(error: BaseException):
    """The hook whose call raised ``error`` inside a fold, or ``None`` when a fold did not raise it.

    The innermost ``Chain._fold`` frame on the traceback holds the hook it
    was calling (nested chains included): reading it afterwards keeps the
    per-event fold free of bookkeeping.
    """
    from pimm_fn.core.fold import Chain  # the fold's own code object identifies its frames

    code = Chain._fold.__code__
    found = None
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is code and tb.tb_next is not None:  # it called on: the hook raised
            found = frame.f_locals.get("hook", found)
        tb = tb.tb_next
    return found


def step_of(event, state) -> int:
    """The step an event belongs to, for a message: the one a step's events name, else the last trained."""
    return event.step if event.__class__ in (ev.BeforeStep, ev.AfterStep) else state.progress.global_step


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


def hook_phase(hook) -> str:
    try:
        return f"hook {protocol.key(hook)}"
    except Exception:  # an identity that itself fails: the repr still names it
        return f"hook {hook!r:.80}"


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
        self._pre_hooks = optimizer._optimizer_step_pre_hooks
        self._pre = optimizer.register_step_pre_hook(self._entering)
        self._post = optimizer.register_step_post_hook(self._stepped)

    @classmethod
    def of(cls, optimizer) -> "StepWatch | None":
        """The watch of ``optimizer``, made on first use; ``None`` for an optimizer without step hooks.

        For a mapping of named optimizers (``loop(optimizers=)``), one watch over all of them.
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
        return self.done

    def phase(self, done_before: int) -> str:
        """Where, around ``optimizer.step()``, a step armed at ``done_before`` raised."""
        entered, self.entered = self.entered, self.done
        if self.done > done_before:
            return AFTER_OPTIMIZER
        return OPTIMIZING if entered > self.done else TRAINING


class _Watches:
    """The watches of several optimizers, read as one: a step raised after any of them stepped is not exact."""

    def __init__(self, watches):
        self.watches = tuple(watches)

    def arm(self) -> int:
        return sum(w.arm() for w in self.watches)

    def phase(self, done_before: int) -> str:
        inside = False
        for w in self.watches:
            inside |= w.entered > w.done
            w.entered = w.done
        if sum(w.done for w in self.watches) > done_before:
            return AFTER_OPTIMIZER
        return OPTIMIZING if inside else TRAINING

