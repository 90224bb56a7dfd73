"""A training run in progress: step it, run it, inspect it, fix it and continue.

``Loop`` owns the impure work (iterating data, the train step) and walks the
lifecycle the pure core defines, handing each event to the core with the
interpreter as executor. Its ``state`` is always a plain value, so a notebook
can look at it between steps. Each step is a transaction: an exception or
``KeyboardInterrupt`` anywhere in it leaves a run that ``run()`` continues
exactly. Build one with ``pimm_fn.loop``.
"""

import warnings

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.fold import start
from pimm_fn.core.schedule import advance, next_event
from pimm_fn.runtime import swap
from pimm_fn.runtime.control import hooks_step_scheduler
from pimm_fn.runtime.context import Context
from pimm_fn.runtime.feed import ResumeNotExactWarning, batch_size
from pimm_fn.runtime.rng import set_torch_rng, torch_rng
from pimm_fn.runtime.step import runner, scalar_outputs, train_step
from pimm_fn.runtime.transaction import (
    AFTER_OPTIMIZER, LOADING, OPTIMIZING, SCHEDULING, TRAINING, Interruption, StepWatch, effect_phase, failing_hook,
    hook_phase,
)

__all__ = ["Loop"]

_CLOSING = (ev.AfterEpoch, ev.AfterTrain)  # the events a step() runs after its AfterStep
_TRAINED = (ev.AfterStep, *_CLOSING)  # an interrupted step whose work ended in one of these has trained


class Loop:
    """A training run in progress. Build it with ``loop(...)``.

    When a hook declares that it emits ``StepScheduler``, the step function
    is handed ``scheduler=None``: the hook's effects step the scheduler.

    A step is a transaction: when anything in it raises (the batch fetch,
    forward, backward, optimizer or scheduler step, a hook, an effect
    handler; a KeyboardInterrupt included), the loop prints where it stopped,
    re-raises, and keeps what the step had done: a drawn batch is trained
    next (with the torch RNG of its first try, so dropout draws the same
    masks), a finished optimizer step is not repeated, a folded event is not
    folded again and an executed effect not executed again (a failed one is
    retried with the torch RNG it first ran with). ``run()`` or ``step()``
    then continues to the weights and trace of an uninterrupted run. Not
    exact, and warned about (``ResumeNotExactWarning``): an exception inside
    ``optimizer.step()`` itself, which may have updated some parameters.

    Attributes:
        state: the current ``State`` (progress, metrics, best values, slots).
        trace: the effects executed so far, as ``TraceEntry`` values.
        interrupted: where the last step stopped on an exception
            (an ``Interruption``: ``step`` and ``phase``), until ``run()`` or
            ``step()`` completes that step; ``None`` otherwise.
    """

    def __init__(self, ctx: Context, hooks, state, step_fn, interpreter):
        self.ctx = ctx
        self.hooks = hooks
        self.state = state
        self._step_fn = step_fn
        self._interpreter = interpreter
        self._peeked = (None, None)  # (state, next_event(state)): the step's tail computes the next head
        # Event classes that process() must see: some hook wants them, or the guard compares them.
        guard = getattr(interpreter, "guard", None)
        self._processed = {
            cls: bool(hooks.active(cls)) or (guard is not None and guard.watches(cls)) for cls in ev.LIFECYCLE
        }
        self._run_step = runner(step_fn, self._processed[ev.AfterStep], ctx.nonfinite)  # ctx: loop()'s policy
        self._scheduler_in_step = not hooks_step_scheduler(hooks.hooks)  # else the hooks step it
        # With the default step the loop steps the scheduler itself, after the step: an exception
        # there then finds the optimizer step done and its outputs kept.
        self._default_step = step_fn is train_step
        self._watch = StepWatch.of(ctx.optimizer)  # one per optimizer: a rebuilt Loop shares it
        # What an interrupted step left; all None when nothing was interrupted (see ``_continue``).
        self._interrupted = None  # the public Interruption
        self._held = None  # (batch, torch RNG before its forward): drawn, not trained
        self._trained = None  # (step, scalars, batch size): optimizer stepped, the scheduler step to do
        self._event = None  # an event whose driver work is done (a step trained, an epoch opened), not folded
        self._work = None  # a Pending: a folded event's effects, not all executed
        self._rng = None  # the torch RNG the failed effect started from

    @property
    def trace(self) -> list:
        return list(self._interpreter.trace)

    @property
    def finished(self) -> bool:
        return self.state.finished and self._interrupted is None

    @property
    def interrupted(self) -> Interruption | None:
        """Where the last step stopped on an exception, until it is completed; else ``None``."""
        return self._interrupted

    def _stopped(self, step: int, phase: str) -> None:
        self._interrupted = Interruption(step, phase)
        self.ctx.say(str(self._interrupted))

    def _dispatch(self, event) -> None:
        if self._processed.get(event.__class__, True):
            try:
                state, work = start(self.hooks, self.state, event, self._interpreter)
            except BaseException as error:  # the fold is pure: nothing changed, the event folds again
                hook = failing_hook(error)
                phase = hook_phase(hook) if hook is not None else f"processing {type(event).__name__}"
                self._stopped(_step_of(event, self.state), phase)
                raise
            self._event, self.state = None, state
            if work is not None:
                self._finish(work)
        else:  # no hook wants it and no guard compares it: process() would only advance
            self._event, self.state = None, advance(self.state, event)

    def _finish(self, work) -> None:
        """Execute ``work`` (a ``Pending``) to the end, keeping it where an effect or a follow-up's fold raises."""
        hooks, interpreter = self.hooks, self._interpreter
        while work.frames:
            entry = work.next_effect
            rng = torch_rng() if entry is not None else None  # a retried effect draws the same numbers
            try:
                work = work.advance(hooks, interpreter)
            except BaseException as error:
                self._work, self._rng, self.state = work, rng, work.state
                if entry is not None:
                    phase = effect_phase(entry.effect)
                else:
                    hook = failing_hook(error)
                    phase = hook_phase(hook) if hook is not None else f"processing {type(work.next_followup).__name__}"
                self._stopped(_step_of(work.frames[0].event, work.state), phase)
                raise
        self._work = None
        self.state = work.state

    def _next_event(self) -> ev.Event | None:
        """``next_event(self.state)``, computed once per state."""
        state, event = self._peeked
        if state is not self.state:
            event = next_event(self.state)
            self._peeked = (self.state, event)
        return event

    def _train(self, step: int) -> ev.AfterStep:
        """Train global step ``step``; returns its ``AfterStep``."""
        ctx = self.ctx
        held = self._held
        if held is None:
            try:
                batch = ctx.feed.next_batch()  # on an exception the feed is back before this fetch
            except BaseException:
                self._stopped(step, LOADING)
                raise
            self._held = held = (batch, torch_rng())
        else:  # the batch an interrupted try drew, with the RNG its forward started from
            batch = held[0]
            set_torch_rng(held[1])
        scheduler = ctx.scheduler if self._scheduler_in_step else None
        after = self._default_step and scheduler is not None  # the loop steps it, below
        nonfinite = ctx.nonfinite
        skips = nonfinite.count if after and nonfinite is not None else 0
        watch = self._watch
        done = watch.arm() if watch is not None else 0
        try:
            scalars = self._run_step(ctx.model, ctx.optimizer, batch, None if after else scheduler, ctx.scaler)
        except BaseException:
            self._step_failed(step, watch.phase(done) if watch is not None else TRAINING)
            raise
        self._held = None
        if after:
            # A batch the non-finite policy left out of the update leaves the scheduler too.
            skipped = nonfinite is not None and nonfinite.policy == "skip" and nonfinite.count > skips
            if not skipped:
                return self._schedule(step, scalars, batch_size(batch))
        self._event = event = ev.after_step(step, scalars, batch_size(batch))
        return event

    def _step_failed(self, step: int, phase: str) -> None:
        if phase is OPTIMIZING or phase is AFTER_OPTIMIZER:
            where = "inside optimizer.step()" if phase is OPTIMIZING else "after optimizer.step() in the train step"
            warnings.warn(
                f"step {step} was interrupted {where}: some parameters may already be updated, so training it "
                f"again from its batch (what run() does) will not end bit-identical to an uninterrupted run",
                ResumeNotExactWarning,
                stacklevel=4,
            )
        self._stopped(step, phase)

    def _schedule(self, step: int, scalars: dict, size: int) -> ev.AfterStep:
        """The scheduler step after the default step's optimizer step; returns the step's ``AfterStep``."""
        self._trained = (step, scalars, size)
        try:
            self.ctx.scheduler.step()
        except BaseException:
            self._stopped(step, SCHEDULING)
            raise
        self._trained = None
        if "lr" in scalars:  # the default step reports the learning rate after its scheduler step
            lr = self.ctx.optimizer.param_groups[0]["lr"]
            scalars["lr"] = lr if lr.__class__ is float else scalar_outputs({"lr": lr})["lr"]
        self._event = event = ev.after_step(step, scalars, size)
        return event

    def _advance(self) -> ev.Event | None:
        """Run the next lifecycle event; returns it, or None when training is over."""
        event = self._next_event()
        cls = event.__class__  # next_event builds exact lifecycle classes
        if cls is ev.AfterStep:
            event = self._train(event.step)
        elif cls is ev.BeforeEpoch:
            self.ctx.feed.start_epoch(event.epoch)
            self._event = event  # opened: a failed fold of it must not open the epoch again
        elif cls is ev.AfterEpoch:
            try:
                self.ctx.feed.end_epoch()  # a stateful loader is drained: a fetch, as fallible
            except BaseException:
                self._stopped(self.state.progress.global_step, LOADING)
                raise
            self._event = event
        elif event is None:
            return None
        self._dispatch(event)
        if cls is ev.AfterTrain:
            self._interpreter.settle()  # every rank learns of a divergence in the last events
            self.ctx.wait_for_save()  # training ends with every checkpoint published
        return event

    def step(self) -> "Loop":
        """Train one step, with the events around it (epoch end, training end).

        After a stop was requested (``State.stop``) the epoch closes and
        training ends within this call; a call on a stopped run that had not
        closed yet (resumed from a checkpoint of the stopping step) only
        runs the closing events. After an interruption (``interrupted``) it
        completes the interrupted step instead, from where it stopped.
        """
        if self._interrupted is not None:
            return self._continue()
        return self._step()

    def _continue(self) -> "Loop":
        """``step()`` after an interruption: finish what the step left, then the rest of it."""
        if self._recover():
            while self._next_event().__class__ in _CLOSING:
                self._advance()
        else:
            self._step()
        self._interrupted = None
        return self

    def _recover(self) -> bool:
        """Do the work an interrupted step left undone; True when that step had trained."""
        if self._trained is not None:
            self._schedule(*self._trained)
        event, work = self._event, self._work
        if event is not None:
            self._dispatch(event)
        elif work is not None:
            if self._rng is not None:
                set_torch_rng(self._rng)
                self._rng = None
            event = work.frames[0].event
            # The loop's state is the one to continue from: Loop.replace may have changed a slot.
            self._finish(attrs.evolve(work, state=self.state))
        else:
            return False  # interrupted before its training: the step runs as usual, with any batch it drew
        if event.__class__ is ev.AfterTrain:
            self._interpreter.settle()
            self.ctx.wait_for_save()
        return event.__class__ in _TRAINED

    def _step(self) -> "Loop":
        state = self.state
        p = state.progress
        position = state.position
        mid_epoch = position == "BeforeEpoch" or (position == "AfterStep" and p.iter_in_epoch < p.iters_per_epoch)
        if mid_epoch and state.stop is None:
            # Mid-epoch: the next events are BeforeStep and AfterStep of the next step.
            step = p.global_step + 1
            if self._processed[ev.BeforeStep]:
                self._dispatch(ev.BeforeStep(step))
            # Else BeforeStep's only effect would be State.position = "BeforeStep", which
            # the AfterStep below overwrites: skipped. A step that raises then leaves the
            # state as it was before the step, and the next step() trains it again.
            self._dispatch(self._train(step))
            if not self.state.progress.at_epoch_end and self.state.stop is None:
                return self  # the next event is a BeforeStep: nothing closes
        else:
            while True:
                event = self._advance()
                if event is None or event.__class__ is ev.AfterStep:
                    break
        while self._next_event().__class__ in _CLOSING:
            self._advance()
        return self

    def run(self, steps: int | None = None):
        """Train ``steps`` more steps, or to the end; returns the state.

        After an interruption the first of them completes the interrupted step.
        """
        p = self.state.progress
        done = 0
        if self._interrupted is not None:
            if steps == 0:
                return self.state
            self.step()
            done = 1
        elif self.finished or p.global_step >= p.max_steps:
            # A checkpoint of the last step may predate AfterTrain (its save was the deferred
            # epoch-end one): then only the closing events remain, and no step to train.
            self.ctx.say(f"training already finished at step {p.global_step}: nothing to do")
            if self.finished:
                return self.state
        while not self.finished and (steps is None or done < steps):
            self.step()
            done += 1
        self.ctx.wait_for_save()  # what run() returns is on disk, as a notebook expects
        return self.state

    def __call__(self):
        """Train to the end; returns the final state."""
        return self.run()

    def __repr__(self):
        p = self.state.progress
        return f"<Loop step {p.global_step}/{p.max_steps}, epoch {p.epoch}, hooks={list(self.hooks.hooks)!r}>"

    def replace(self, old, new, *, fresh: bool = False) -> "Loop":
        """Swap hook ``old`` for ``new`` in this live run, and continue without rebuilding it.

        For fixing a hook, or an evaluator function, between steps (after a
        ``step()``/``run(steps=n)``, or after one raised): redefine it, swap
        it in, call ``run()`` again. ``old`` is found at any depth of nested
        chains. The new hook is bound to the model (``model_hook``), and
        everything built from the hooks is rebuilt from the new list: the
        evaluators (an ``Evaluate`` runs the new function), the hook
        identities the next checkpoint keys slots by, the run's advice and
        which events the loop processes. The new hook takes over the old
        one's slot (counters keep counting); its subscription (``events``,
        ``every``) may differ, by design: it decides what happens from now
        on, and the steps already trained are not revisited.

        A checkpoint written after the swap keeps the new hook's slot under
        the new hook's identity: resume from it with the new hook list (with
        the old list, the old hook would start from its initial slot).

        Args:
            old: a hook of the run, its identity (``pimm_fn.core.hook.key``,
                e.g. ``"log_every(5)"``), or its identity path inside chains
                (``"logs / log_every(5)"``).
            new: the hook that takes its place.
            fresh: start ``new`` from its initial slot instead of taking over
                the old one's.

        Returns:
            This ``Loop``, for chaining (``run.replace(a, b).run()``).

        Raises:
            ValueError: no hook ``old`` (the message lists the hooks there
                are), or several at different depths (pass its path).
            TypeError: ``new`` is not a hook, or the old hook's slot does not
                fit ``new`` (its initial slot has another type): the message
                names both hooks and both types.
            DuplicateHookError: ``new``'s identity is another hook's beside it.
            RuntimeError: a process group is initialized: rebuild the loop
                with the new hook list on every rank and resume instead.

        >>> run.replace(pf.evaluate_every(4, broken, name="val"),
        ...             pf.evaluate_every(4, fixed, name="val")).run()  # doctest: +SKIP
        """
        swap.replace(self, old, new, fresh=fresh)
        return self

    def replace_evaluator(self, name: str, fn) -> "Loop":
        """Swap the function of the ``evaluate_every`` hook whose evaluator is ``name``; see ``replace``.

        The hook keeps its cadence, name and ``broadcast``; only ``fn`` changes
        (and with it the hook's identity, which names the function).

        Returns:
            This ``Loop``, for chaining.

        Raises:
            ValueError: no evaluator ``name`` (the message lists those there are).
            TypeError: ``name`` comes from a hook other than ``evaluate_every``:
                build its replacement and call ``replace``.

        >>> run.replace_evaluator("val", fixed).run()  # doctest: +SKIP
        """
        swap.replace_evaluator(self, name, fn)
        return self


def _step_of(event, state) -> int:
    """The step an event belongs to, for a message: the one a step's events name, else the last trained."""
    return event.step if event.__class__ in (ev.BeforeStep, ev.AfterStep) else state.progress.global_step
