"""A training run in progress: step it, run it, inspect it, fix it and continue.

``Loop`` owns the impure work (iterating data, the train step) and walks the
lifecycle the pure core defines, handing each event to the core with the
interpreter as executor. Its ``state`` is always a plain value, so a notebook
can look at it between steps. Each step is a transaction: an exception or
``KeyboardInterrupt`` anywhere in it leaves a run that ``run()`` continues
exactly. Build one with ``pimm_fn.loop``.
"""

import contextlib
import sys

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core import display
from pimm_fn.core.fold import start
from pimm_fn.core.schedule import advance, last_quiet_step, next_event, skip_to
from pimm_fn.core.trace import Trace
from pimm_fn.runtime import swap
from pimm_fn.runtime.control import hooks_step_scheduler
from pimm_fn.runtime.context import Context
from pimm_fn.runtime.ctrl_c import CTRL_C
from pimm_fn.runtime.feed import batch_size
from pimm_fn.runtime.peers import across_ranks
from pimm_fn.runtime.rng import set_torch_rng, torch_rng
from pimm_fn.runtime.outputs import Unread
from pimm_fn.runtime.step import runner, scalar_outputs, train_step
from pimm_fn.runtime.transaction import (
    LOADING, SCHEDULING, TRAINING, Interruption, StepWatch, effect_phase, failing_hook, hook_phase, step_of,
    warn_if_not_exact,
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

    With several ranks, a failure alike on every rank (same step, same
    phase: a deterministic bug in a hook or handler) continues exactly the
    same way. A failure on some ranks only never hangs the others: the
    group is shut down and every rank raises within seconds (those that did
    not fail: ``PeerFailureError``); rebuild with ``resume="auto"`` (``peers``).

    In a notebook a cell ending in ``run``, ``run.state`` or ``run.trace``
    shows a short summary (``print`` shows the same): step of total, epoch,
    metrics, best values, the last save and train log, each hook by its
    identity beside its slot (``pimm_fn.core.display``).

    Attributes:
        state: the current ``State`` (progress, metrics, best values, slots).
        trace: the effects executed so far, a ``Trace`` of ``TraceEntry`` values.
        history: what the main rank logged (``log_every``'s records, each
            evaluation), as columns for pandas and matplotlib; kept beside
            the state, rebuilt from ``log.jsonl`` on resume.
        interrupted: where the last step stopped on an exception
            (an ``Interruption``: ``step`` and ``phase``), until ``run()`` or
            ``step()`` completes that step; ``None`` otherwise.
    """

    def __init__(self, ctx: Context, hooks, state, step_fn, interpreter):
        self.ctx = ctx
        self.hooks = hooks
        self._state = state
        # Quiet steps (no hook is called for them): trained and counted, not folded one by one.
        self._quiet_until = 0  # the last step that may be trained quietly (0: the next one is walked)
        self._quiet = None  # (last quiet step trained, its samples in all) since ``_state``; see ``state``
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
        self._keys = CTRL_C  # a real Ctrl-C: taken inside the step's work, held back in the loop's records
        self._unread = Unread()  # outputs of steps no hook read yet, on their device (pimm_fn.runtime.outputs)

    @property
    def state(self):
        """The current ``State``; the quiet steps trained since the last event a hook saw are in it."""
        if self._quiet is not None:
            step, samples = self._quiet
            self._state, self._quiet = skip_to(self._state, step, samples=samples), None
        return self._state

    @state.setter
    def state(self, state) -> None:
        if self._quiet is not None:
            raise RuntimeError("Loop.state was replaced while quiet steps were not yet in it: read it first")
        self._state, self._quiet_until = state, 0  # the next step is walked, and opens the next quiet stretch

    @property
    def history(self):
        """What the run logged, as columns (``pimm_fn.runtime.history.History``): ``run.history.to_pandas()``."""
        return self.ctx.logs.history

    @property
    def trace(self) -> Trace:
        """The effects executed so far, as a ``Trace``: equal to a list (or ``plan``'s tuple) of the same entries."""
        return Trace(self._interpreter.trace, map(display.hook_label, self.hooks.hooks))

    @property
    def finished(self) -> bool:
        return self._state.finished and self._interrupted is None  # quiet steps never finish a run

    @property
    def interrupted(self) -> Interruption | None:
        """Where the last step stopped on an exception, until it is completed; else ``None``."""
        return self._interrupted

    def _stopped(self, step: int, phase: str) -> None:  # in every failure's except block
        self._keys.open = False
        self._interrupted = Interruption(step, phase)  # first: an interrupt while the ranks agree keeps it
        self._interrupted, instead = across_ranks(self._interrupted, sys.exc_info()[1])  # see peers
        self._interpreter.close(on_error=True)  # loggers and bar: reopened, appending, when the run goes on
        self.ctx.say(str(self._interrupted))
        if instead is not None:  # a PeerFailureError: this rank's error came from another rank's failure
            raise instead

    def _dispatch(self, event) -> None:
        cls = event.__class__
        if cls is ev.AfterEpoch and self._unread or cls is ev.AfterStep and event.outputs:
            event = self._read(event)  # the outputs waiting on the device, and these, read at once
        if self._processed.get(cls, True):
            try:
                self._keys.start()
                state, work = start(self.hooks, self.state, event, self._interpreter)
            except BaseException as error:  # the fold is pure: nothing changed, the event folds again
                hook = failing_hook(error)
                phase = hook_phase(hook) if hook is not None else f"processing {type(event).__name__}"
                self._stopped(step_of(event, self.state), phase)
                raise
            self._keys.open = False
            self._event, self.state = None, state
            if work is not None:
                self._finish(work)
        else:  # no hook wants it and no guard compares it: process() would only advance
            self._event, self.state = None, advance(self.state, event)

    def _read(self, event=None):
        """``event`` after reading every unread output in one transfer: the NaN check, then the accumulating hooks.

        The fold then gets the event with float outputs. Nothing is kept until
        all succeeded: a NaN under ``"raise"`` raises again on a retry.
        Without an event (the end of ``run()``, a hook swap) it reads what waits.
        """
        try:
            self._keys.start()
            pending, current = self._unread.read(event.outputs if event.__class__ is ev.AfterStep else None)
            nonfinite = self.ctx.nonfinite
            if nonfinite is not None and not nonfinite.before_backward:
                losses = [(step, o["loss"]) for step, o in pending if "loss" in o]
                if current is not None and "loss" in current:
                    losses.append((event.step, current["loss"]))
                nonfinite.read(losses)
            self._keys.open = False
        except BaseException:
            where = f" before {type(event).__name__}" if event is not None else ""
            self._stopped(step_of(event, self.state) if event is not None else self.state.progress.global_step,
                          f"reading the step outputs{where}")
            raise
        slots = self.state.slots
        if self.hooks._accumulators:
            for _, outputs in pending:
                slots = self.hooks._accumulate(slots, outputs)
        if slots is not self.state.slots:
            self.state = attrs.evolve(self.state, slots=slots)
        self._unread.clear()
        return event if current is None else attrs.evolve(event, outputs=current)

    def _finish(self, work) -> None:
        """Execute ``work`` (a ``Pending``) to the end, keeping it where an effect or a follow-up's fold raises."""
        hooks, interpreter = self.hooks, self._interpreter
        while work.frames:
            entry = work.next_effect
            rng = torch_rng() if entry is not None else None  # a retried effect draws the same numbers
            try:
                self._keys.start()
                work = work.advance(hooks, interpreter)
                self._keys.open = False
            except BaseException as error:
                self._work, self._rng, self.state = work, rng, work.state
                if entry is not None:
                    phase = effect_phase(entry.effect)
                else:
                    hook = failing_hook(error)
                    phase = hook_phase(hook) if hook is not None else f"processing {type(work.next_followup).__name__}"
                self._stopped(step_of(work.frames[0].event, work.state), phase)
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

    def _train(self, step: int) -> None:
        """Train global step ``step``, and fold its ``AfterStep`` (or count it, when no hook is called for it)."""
        ctx = self.ctx
        held = self._held
        if held is None:
            try:
                self._keys.start()
                batch = ctx.feed.next_batch()  # on an exception the feed is back before this fetch
                self._keys.open = False
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
            self._keys.start()
            scalars = self._run_step(ctx.model, ctx.optimizer, batch, None if after else scheduler, ctx.scaler)
        except BaseException:
            phase = watch.phase(done) if watch is not None else TRAINING
            warn_if_not_exact(step, phase)
            self._stopped(step, phase)
            raise
        self._keys.open = False
        self._held = None
        if after:
            # A batch the non-finite policy left out of the update leaves the scheduler too.
            skipped = nonfinite is not None and nonfinite.policy == "skip" and nonfinite.count > skips
            if not skipped:
                return self._schedule(step, scalars, batch_size(batch))
        self._trained_step(step, scalars, batch_size(batch))

    def _trained_step(self, step: int, scalars: dict, size: int) -> None:
        """Hand the trained ``step`` on: counted when it is quiet, else its ``AfterStep`` folded."""
        if step <= self._quiet_until:  # no hook is called for it: the state takes it when next read
            if scalars:
                self._unread.add(step, scalars)
            self._quiet = (step, size + (self._quiet[1] if self._quiet is not None else 0))
            return
        self._event = event = ev.AfterStep(step, self._later(step, scalars), size)
        self._dispatch(event)

    def _later(self, step: int, outputs: dict) -> dict:
        """The outputs ``AfterStep(step)`` carries: none when no hook reads them there (they wait, unread)."""
        if outputs and not (self._processed[ev.AfterStep] and self.hooks.reads(step)):
            self._unread.add(step, outputs)
            return {}
        return outputs

    def _schedule(self, step: int, scalars: dict, size: int) -> None:
        """The scheduler step after the default step's optimizer step, then the step handed on (``_trained_step``)."""
        self._trained = (step, scalars, size)
        try:
            self._keys.start()
            with self._keys.holding_back():
                self.ctx.scheduler.step()
            self._keys.open = False
        except BaseException:
            self._stopped(step, SCHEDULING)
            raise
        self._trained = None
        if "lr" in scalars:  # the default step reports the learning rate after its scheduler step
            lr = self.ctx.optimizer.param_groups[0]["lr"]
            scalars["lr"] = lr if lr.__class__ is float else scalar_outputs({"lr": lr})["lr"]
        self._trained_step(step, scalars, size)

    def _advance(self) -> ev.Event | None:
        """Run the next lifecycle event; returns it, or None when training is over."""
        event = self._next_event()
        cls = event.__class__  # next_event builds exact lifecycle classes
        if cls is ev.AfterStep:
            self._train(event.step)  # folded there: a quiet step's AfterStep is only counted
            return event
        if cls is ev.BeforeEpoch:
            try:
                self._keys.start()
                self.ctx.feed.start_epoch(event.epoch)  # a retry opens it from the same RNG
                self._keys.open = False
            except BaseException:
                self._stopped(self.state.progress.global_step, LOADING)
                raise
            self._event = event  # opened: a failed fold of it must not open the epoch again
        elif cls is ev.AfterEpoch:
            try:
                self._keys.start()
                self.ctx.feed.end_epoch()  # a stateful loader is drained: a fetch, as fallible
                self._keys.open = False
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
            self._interpreter.close()  # and every record written, the loggers and the bar closed
            self._free_save_dir()
        return event

    def _free_save_dir(self) -> None:
        """Training ended, every save published: release ``save_dir``'s lock (``pimm_fn.runtime.lock``)."""
        if self.ctx.lock is not None:
            self.ctx.lock.release()

    def step(self) -> "Loop":
        """Train one step, with the events around it (epoch end, training end).

        After a stop was requested (``State.stop``) the epoch closes and
        training ends within this call; a call on a stopped run that had not
        closed yet (resumed from a checkpoint of the stopping step) only
        runs the closing events. After an interruption (``interrupted``) it
        completes the interrupted step instead, from where it stopped.
        A Ctrl-C the loop held back (``pimm_fn.runtime.ctrl_c``) is raised
        at the end, where nothing is in flight.
        """
        with self._keys, self._clock():
            self._step_once()
        return self

    def _step_once(self) -> None:
        self._continue() if self._interrupted is not None else self._step()
        try:
            self._keys.safe_point()
        except KeyboardInterrupt:
            self._interpreter.close(on_error=True)  # as on any stop: the bar ends above the line
            self.ctx.say(f"interrupted after step {self.state.progress.global_step}; run() continues exactly")
            raise

    @contextlib.contextmanager
    def _clock(self):
        """The logs' clock runs inside ``run()`` and ``step()`` only: their pace counts training time."""
        logs = self.ctx.logs
        if logs is None:
            yield
            return
        logs.go()
        try:
            yield
        finally:
            logs.hold()

    def _continue(self) -> "Loop":
        """``step()`` after an interruption: finish what the step left, then the rest of it."""
        if not self._interrupted.continues:
            raise RuntimeError(f"cannot continue this run: {self._interrupted}")
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
            self._schedule(*self._trained)  # and the step handed on
            return True
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
            self._interpreter.close()
            self._free_save_dir()
        return event.__class__ in _TRAINED

    def _step(self) -> "Loop":
        step = self._state.progress.global_step + 1 if self._quiet is None else self._quiet[0] + 1
        if step <= self._quiet_until:  # a quiet step: nothing but its training
            self._train(step)
            return self
        while True:
            event = self._advance()
            if event is None or event.__class__ is ev.AfterStep:
                break
        while self._next_event().__class__ in _CLOSING:
            self._advance()
        self._open_quiet()
        return self

    def _open_quiet(self) -> None:
        """Where the next step begins, the steps up to the next one a hook is called for are quiet."""
        state = self._state
        if self._quiet is None and not self._processed[ev.BeforeStep] and self._next_event().__class__ is ev.BeforeStep:
            self._quiet_until = last_quiet_step(self.hooks, state.progress)

    def run(self, steps: int | None = None):
        """Train ``steps`` more steps, or to the end; returns the state.

        After an interruption the first of them completes the interrupted step.
        The returned ``State`` is ``run.state``: a notebook cell ending in
        ``run.run(...)`` shows its summary (progress, metrics, best values,
        slots), as ``print`` does; ``repr`` gives every field.
        """
        with self._keys, self._clock():
            return self._run(steps)

    def _run(self, steps: int | None):
        p = self.state.progress
        done = 0
        if self._interrupted is not None:
            if steps == 0:
                return self.state
            self._step_once()
            done = 1
        elif self.finished or not p.steps_left:
            # A checkpoint of the last step may predate AfterTrain (its save was the deferred
            # epoch-end one): then only the closing events remain, and no step to train.
            self.ctx.say(f"training already finished at step {p.global_step}: nothing to do")
            if self.finished:
                return self.state
        while not self.finished and (steps is None or done < steps):
            self._step_once()
            done += 1
        if self._unread:
            self._read()  # the state run() returns holds every output (a NaN among them is said here)
        self.ctx.wait_for_save()  # what run() returns is on disk, as a notebook expects
        return self.state

    def __call__(self):
        """Train to the end; returns the final state."""
        return self.run()

    def __repr__(self):
        p = self.state.progress
        hooks = ", ".join(map(display.hook_label, self.hooks.hooks))  # by identity: no function addresses
        return f"<Loop step {p.global_step}/{p.global_step + p.steps_left}, epoch {p.epoch}, hooks=[{hooks}]>"

    def _rows(self) -> list:
        """The summary a notebook shows: ``pimm_fn.core.display.run_rows``, and where an interruption stopped."""
        rows = display.run_rows(self.state, self.hooks.hooks, self._interpreter.trace)
        return rows + [("interrupted", str(self._interrupted))] if self._interrupted is not None else rows

    def __str__(self) -> str:
        return display.render_text("Loop", self._rows())

    def _repr_pretty_(self, printer, cycle) -> None:
        display.pretty(printer, str(self), cycle)

    def _repr_html_(self) -> str:
        return display.render_html("Loop", self._rows(), self.state.progress)

    def replace(self, old, new, *, fresh: bool = False) -> "Loop":
        """Swap hook ``old`` (a hook, its identity or its path in chains) for ``new`` in this live run.

        Fix a hook between steps, or after one raised, and ``run()`` on; see
        ``pimm_fn.runtime.swap.replace`` for what carries over and what is
        refused. Returns this ``Loop``: ``run.replace(a, b).run()``.
        """
        if self._unread:
            self._read()  # the old hook's sums take what waits, before the new one takes its slot
        swap.replace(self, old, new, fresh=fresh)
        return self

    def replace_evaluator(self, name: str, fn) -> "Loop":
        """Swap the function of the ``evaluate_every`` hook whose evaluator is ``name``; see ``replace``."""
        swap.replace_evaluator(self, name, fn)
        return self

