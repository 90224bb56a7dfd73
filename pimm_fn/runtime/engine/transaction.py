"""A training step as a transaction: where an interrupted step stopped, around ``optimizer.step()`` too, and what it can retry exactly.

An exception or KeyboardInterrupt anywhere in a step (the fetch, forward,
backward, optimizer or scheduler step, a hook, an effect handler) leaves the
loop at a point ``run()`` continues from to the same weights and trace as an
uninterrupted run. This module holds what the loop needs for that beyond
the core's resumable ``process`` (``pimm_fn.core.processing.Pending``):

* ``Interruption``, the public value ``Loop.interrupted`` shows and the line
  the loop prints;
* the phases a step can stop in (a train step's exception is placed
  around ``optimizer.step()`` by ``pimm_fn.runtime.engine.transaction``);
* ``failing_hook``, the hook a fold raised in, read from the traceback so
  the fold itself pays nothing for it;
* ``Transaction``, the one protocol every unit of a step's work runs in
  (``with unit:``), and the records of what an interrupted step left for
  ``run()`` to finish.

Across ranks (a process group of two or more), see ``pimm_fn.runtime.engine.peers``:
a step that fails on every rank at the same global step and in the same
phase (a deterministic bug in a hook or an effect handler) leaves every rank
at a point ``run()`` continues from exactly, as in one process. A step that
fails on some ranks only, or in different places, never hangs the others:
the process group is shut down, every rank raises within seconds (the ranks
that did not fail with ``PeerFailureError`` naming the rank that did), and
``interrupted.continues`` is False: the run must be rebuilt on every rank,
in a fresh process group, with ``resume="auto"``.

Where, around ``optimizer.step()``, a train step raised: the one thing that decides whether its retry is exact.

``StepWatch`` registers step hooks on the optimizer that count its step
entries and completions: an exception before ``optimizer.step()`` changed
anything leaves a step whose retry is exact; inside it some parameters may
have changed, and after it (still in the train step) they all have, so the
retry from the same batch is not exact, and ``warn_if_not_exact`` says so
(``ResumeNotExactWarning``). From the step's entry on, a Ctrl-C is held back
(``pimm_fn.runtime.engine.preemption``) until the loop has recorded the step.
"""

import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.runtime.engine.peers import across_ranks
from pimm_fn.runtime.engine.preemption import CTRL_C, interactive
from pimm_fn.runtime.errors import NonFiniteLossError, ResumeNotExactWarning

__all__ = [
    "Interruption",
    "Transaction",
    "Unit",
    "failing_hook",
    "effect_phase",
    "fold_phase",
    "StepWatch",
    "warn_if_not_exact",
    "retried_inexactly",
    "fetched_inexactly",
    "drained_inexactly",
    "effect_retried_inexactly",
    "OPTIMIZING",
    "AFTER_OPTIMIZER",
]


LOADING = "loading the batch"


TRAINING = "the train step"


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
    # Said instead of "run() continues exactly from here" where that would fail again (a NaN loss); its text
    # is in the line (str), not the repr, which stays the one a notebook shows.
    advice: str | None = attrs.field(default=None, repr=False)

    def __str__(self) -> str:
        where = f"interrupted at step {self.step} during {self.phase}"
        if self.continues:
            return f"{where}; {self.advice or 'run() continues exactly from here'}"
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


def step_of(event) -> int | None:
    """The step an event belongs to, for a message: the one a step's events name, else ``None`` (the last trained)."""
    return event.step if event.__class__ is ev.AfterStep or event.__class__ is ev.BeforeStep else None


def hook_phase(hook) -> str:
    try:
        return f"hook {protocol.key(hook)}"
    except Exception:  # an identity that itself fails: the repr still names it
        return f"hook {hook!r:.80}"


def fold_phase(error: BaseException, event) -> str:
    """Where folding ``event`` raised ``error``: the hook it raised in, else the fold itself."""
    hook = failing_hook(error)
    return hook_phase(hook) if hook is not None else f"processing {type(event).__name__}"


def _scripts_ctrl_c(error: BaseException) -> bool:
    """A Ctrl-C in a script: its exit says where it stopped and how to continue (``pimm_fn.runtime.engine.preemption``)."""
    return error.__class__ is KeyboardInterrupt and not interactive()


class Transaction:
    """The protocol of every unit of a step's work, and what an interrupted step left.

    A unit (a fetch, the train step, a scheduler step, a fold, an effect)
    runs as ``with unit:``, ``unit`` made once by ``transaction.unit(phase)``
    (a ``Unit``): it raises first a Ctrl-C held back until then
    (``pimm_fn.runtime.engine.preemption``), lets one land inside the block, and holds
    one back again when the block ends. When the block raises, it records
    where the step stopped (``interrupted``, agreed across ranks:
    ``pimm_fn.runtime.engine.peers``), closes the interpreter's handlers (the
    loggers and bar reopen, appending, when the run goes on), prints the
    ``Interruption`` line and lets the exception go on (or the
    ``PeerFailureError`` that replaces it; a script's Ctrl-C is said once, as
    it leaves the script: ``pimm_fn.runtime.engine.preemption``). The step it names is ``step``,
    which the walker sets before its units run (``None``: the last step
    trained, ``last_step()``, read only then); ``phase`` is a string, or a
    function of ``(step, error)`` giving one, called only then (it may
    record what the unit leaves). Units are made once and reused: entering
    one costs what a ``try`` and a flag cost.

    The records, all ``None`` while nothing is interrupted, are what
    ``run()`` finishes first: ``held`` (the batch drawn and not trained, with
    the torch RNG its forward started from), ``trained`` (``(step, scalars,
    batch size)``: the optimizer stepped, the scheduler step to do),
    ``event`` (the event being handed to the hooks, its driver work done: a
    failed fold folds it again), ``work`` (a ``Pending``: a folded event's
    effects, not all executed) and ``rng`` (the torch RNG the failed effect
    started from).
    """

    __slots__ = (
        "keys",
        "step",
        "interrupted",
        "held",
        "trained",
        "event",
        "work",
        "rng",
        "_ctx",
        "_interpreter",
        "_last_step",
    )

    def __init__(self, ctx, interpreter, last_step, keys=CTRL_C):
        self.keys = keys  # a real Ctrl-C: taken inside a unit, held back in the loop's records
        self.step = self.interrupted = self.held = self.trained = self.event = self.work = self.rng = None
        self._ctx, self._interpreter, self._last_step = ctx, interpreter, last_step

    def unit(self, phase) -> "Unit":
        """A unit of this transaction that stops in ``phase`` (a string, or a function of ``(step, error)``)."""
        return Unit(self, phase)

    def stop(self, phase, error: BaseException) -> None:
        """Record where the step stopped on ``error``, agreed across ranks, and say it (see the class docstring)."""
        self.keys.open = self.keys.pending = False  # a Ctrl-C raised in the unit is seen: it stops no other
        phase = phase if phase.__class__ is str else phase(self.step, error)
        step = self.step if self.step is not None else self._last_step()
        advice = error.advice if isinstance(error, NonFiniteLossError) else None  # continuing would raise it again
        self.interrupted = Interruption(
            step, phase, advice=advice
        )  # first: an interrupt while the ranks agree keeps it
        self.interrupted, instead = across_ranks(self.interrupted, error)
        self._interpreter.close(on_error=True)
        if not (self.interrupted.continues and _scripts_ctrl_c(error)):  # a script's says one line as it exits
            self._ctx.say(str(self.interrupted))
        if instead is not None:  # a PeerFailureError: this rank's error came from another rank's failure
            raise instead

    def stopped_after(self, step: int) -> None:
        """A Ctrl-C held back to the end of ``step`` is raised there (nothing in flight): close and say so."""
        self._interpreter.close(on_error=True)  # as on any stop: the bar ends above the line
        if not interactive():  # a script cannot continue: its exit says one line (pimm_fn.runtime.engine.preemption)
            return
        self._ctx.say(f"interrupted after step {step}; run() continues exactly")


class Unit:
    """One unit of a step's work in its ``Transaction``: ``with unit:`` (see ``Transaction``)."""

    __slots__ = ("_tx", "_keys", "_phase")

    def __init__(self, tx: Transaction, phase):
        self._tx, self._keys, self._phase = tx, tx.keys, phase

    def __enter__(self) -> None:
        keys = self._keys  # CtrlC.start, inlined: a quiet step opens two units
        keys.holding = False  # an optimizer step that raised never released it
        if keys.pending:  # a Ctrl-C held back until this unit: it stops here
            keys.pending = False
            error = KeyboardInterrupt()
            self._tx.stop(self._phase, error)
            raise error
        keys.open = True

    def __exit__(self, kind, error, traceback) -> Literal[False]:
        keys = self._keys
        keys.open = False
        if error is None:
            return False
        if keys.pending and error.__class__ is not KeyboardInterrupt:
            # The Ctrl-C raised in this unit came back as another error (torch's zip writer, interrupted in its
            # Python write, raises "unexpected pos"): the step stopped on the interruption, and continues as after one.
            interrupt = KeyboardInterrupt()
            self._tx.stop(self._phase, interrupt)
            raise interrupt from error
        self._tx.stop(self._phase, error)
        return False


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


def retried_inexactly(step: int, error: BaseException) -> str:
    """The phase of a train step that raised under ``Training(exact_retry=False)``: its retry is warned as not exact."""
    return _not_exact(
        TRAINING,
        f"step {step} was interrupted in the train step with Training(exact_retry=False): training it again "
        f"(what run() does) starts from the RNG as it is now, and applies the optimizer step twice if it had run",
    )


def fetched_inexactly(step: int, error: BaseException) -> str:
    """The phase of a fetch that raised under ``Training(exact_retry=False)`` over data that may draw from the RNG."""
    return _not_exact(
        LOADING,
        f"step {step}'s batch was interrupted while fetched with Training(exact_retry=False): fetching it again "
        f"(what run() does) gives the same samples, but draws any random augmentation from the RNG as it is now",
    )


def drained_inexactly(step: int | None, error: BaseException) -> str:
    """The phase of an epoch's drain that raised under ``Training(exact_retry=False)`` over data that may draw."""
    return _not_exact(
        LOADING,
        "the loader was interrupted while drained at the epoch's end with Training(exact_retry=False): draining it "
        "again (what run() does) gives the same samples, but draws any random augmentation from the RNG as it is now",
    )


def effect_retried_inexactly(effect) -> str:
    """The phase of an effect that raised under ``Training(exact_retry=False)``: its retry is warned as not exact."""
    return _not_exact(
        effect_phase(effect),
        f"effect {type(effect).__name__} at step {getattr(effect, 'step', '?')} was interrupted with "
        f"Training(exact_retry=False): running it again (what run() does) draws any random numbers it uses "
        f"from the RNG as it is now",
        stacklevel=6,  # one frame more: called from the walker's phase method
    )


def _not_exact(phase: str, what: str, stacklevel: int = 5) -> str:
    """Warn that continuing after ``what`` is not exact, with the two ways to an exact one; returns ``phase``."""
    warnings.warn(
        f'{what}; for an exact continuation resume from the last checkpoint (resume="auto"), or keep exact_retry on',
        ResumeNotExactWarning,
        stacklevel=stacklevel,  # past this function and the phase's: where the unit stopped the step
    )
    return phase


class StepWatch:
    """Counts the optimizer's step entries and completions, to place an exception around ``optimizer.step()``.

    The pre-hook is kept the last of the optimizer's step pre-hooks (a hook
    registered later is moved before it at the next ``arm``), so that its
    count means every pre-hook passed and the step's body began. One watch
    per optimizer: loops rebuilt around it (``Loop.replace``) share it.
    """

    _watches: "weakref.WeakKeyDictionary[Any, StepWatch]" = weakref.WeakKeyDictionary()

    def __init__(self, optimizer):
        self.entered = 0
        self.done = 0
        self.armed = 0  # the completions when the last step was armed
        self._pre_hooks = optimizer._optimizer_step_pre_hooks
        self._pre = optimizer.register_step_pre_hook(self._entering)
        self._post = optimizer.register_step_post_hook(self._stepped)

    @classmethod
    def of(cls, optimizer) -> "StepWatch | _Watches | None":
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

    def stopped(self: "StepWatch | _Watches", step: int, error: BaseException) -> str:
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
