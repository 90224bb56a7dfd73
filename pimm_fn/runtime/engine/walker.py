"""Walking a run's lifecycle, one training step at a time: the engine inside ``Loop``.

The ``Walker`` takes the events in the pure core's order
(``pimm_fn.core.schedule.next_event``), has the driver train each step
(``pimm_fn.runtime.step.driver``), and hands each event to the hooks with the
interpreter as executor (``pimm_fn.core.processing.start``). Every unit of that
work runs in the step's transaction (``pimm_fn.runtime.engine.transaction``), so
after an exception the next step first finishes what the interrupted one
left. Steps no hook is called for are trained and counted, not folded
(``pimm_fn.runtime.engine.outputs``); on the others a ``BeforeStep`` no hook wants
builds nothing (the step's ``AfterStep`` moves the position past it), and
the step's outputs are read before its one ``AfterStep`` is built.
Under ``FaultTolerance`` every step is walked: before its ``BeforeStep`` the
replica groups' quorum (a heal there), the epoch sized for its
participants; a step whose commit vote fails comes back to that boundary
and is walked again (``pimm_fn.runtime.replicas.switch``).
"""

from collections.abc import Mapping
from functools import partial
from typing import Any

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.core.outputs import StepOutputs
from pimm_fn.core.processing import start
from pimm_fn.core.schedule import advance, next_event
from pimm_fn.core.state import State
from pimm_fn.core.step_state import built, global_step_of
from pimm_fn.runtime.engine.outputs import QuietSteps, read_in_place
from pimm_fn.runtime.engine.preemption import preemption_save, saved_at
from pimm_fn.runtime.engine.transaction import (
    LOADING,
    Transaction,
    drained_inexactly,
    effect_phase,
    effect_retried_inexactly,
    fold_phase,
    step_of,
)
from pimm_fn.runtime.errors import Preempted
from pimm_fn.runtime.replicas.commit import Discarded
from pimm_fn.runtime.step.configurable import built_in
from pimm_fn.runtime.step.driver import Driver
from pimm_fn.runtime.step.rng import set_torch_rng, torch_rng
from pimm_fn.runtime.step.train_step import runner, train_step

__all__ = ["Walker"]

_CLOSING = (ev.AfterEpoch, ev.AfterTrain)  # the events a step() runs after its AfterStep
_TRAINED = (ev.AfterStep, *_CLOSING)  # an interrupted step whose work ended in one of these has trained


class Walker:
    """The lifecycle of one run, walked a step at a time; ``Loop`` is its public face.

    Args:
        ctx: the run's parts (``pimm_fn.runtime.engine.interpreter.Context``), ``ctx.implied`` its hooks.
        state: the ``State`` to walk on from.
        step_fn: the train step, as ``loop(step_fn=)`` gave it.
        interpreter: the executor of the hooks' effects.

    Attributes:
        tx: the step's ``Transaction``: its units, and what an interrupted step left.
        processed: the event classes the hooks must see (some hook wants them, or the guard compares them).
    """

    def __init__(self, ctx, state, step_fn, interpreter, *, told_finished: bool = False):
        self.ctx, self._state, self._step_fn, self._interpreter = ctx, state, step_fn, interpreter
        self._told_finished = told_finished  # loop() said there is nothing to train: the next run() need not
        self.tx = tx = Transaction(ctx, interpreter, last_step=lambda: self.state.progress.global_step)
        # The walker's units of work (the driver has its own): made once, entered on every event.
        self._opening = tx.unit(LOADING)  # an epoch opened: a retry opens it from the same RNG
        # Its loader drained at its end: without exact retry no RNG is kept for the drain (warned on a retry).
        self._draining = tx.unit(LOADING if ctx.feed.refetched_exactly else drained_inexactly)
        self._folding = tx.unit(lambda step, error: fold_phase(error, tx.event))
        self._reading = tx.unit(self._stopped_reading)  # before an event (``tx.event``, or the step being read)
        # (step, outputs, batch size) of the AfterStep whose outputs are being read
        self._reading_step: tuple[int, dict, int] | None = None
        self._reading_waiting = tx.unit("reading the step outputs")
        self._working = tx.unit(self._stopped_in_work)
        self._quiet = QuietSteps()  # steps trained and counted, not folded; outputs unread on their device
        # Under FaultTolerance: the state a discarded step comes back to, and the torch RNG there.
        self._boundary: tuple[State, tuple] | None = None
        self._stopping = ctx.stopping  # preemption and max_time, asked at each step's end (None: a bare Context)
        self.use(ctx.implied)

    def use(self, implied) -> None:
        """Walk on with the hooks of ``implied`` (``pimm_fn.runtime.engine.implied``): at build, and after ``replace``."""
        self.hooks, self.processed = implied.hooks, dict(implied.processed)
        self._replicas = self.ctx.replicas  # under FaultTolerance: a quorum before every step
        self._quiet_steps = implied.quiet_steps and self._replicas is None  # no quiet stretch between quorums
        # A built-in step casts the replica groups' vote after its backward; a custom one at optimizer.step().
        vote = self._replicas.vote if self._replicas is not None and built_in(self._step_fn) else None
        self._driver = Driver(
            self.ctx,
            self.tx,
            runner(self._step_fn, implied.processed[ev.AfterStep], self.ctx.nonfinite, vote),
            scheduler_in_step=not implied.steps_scheduler,  # else the hooks step it
            default_step=self._step_fn is train_step,
            trained=self._trained,
        )
        # (state, next_event(state)): the step's tail computes the next head
        self._peeked: tuple[State | None, ev.Event | None] = (None, None)

    @property
    def state(self):
        """The current ``State``; the quiet steps trained since the last event a hook saw are in it.

        Built here when the last step's hooks left a ``StepState`` (``pimm_fn.core.step_state``).
        """
        state = self._state = built(self._state)
        if self._quiet.last is not None:
            state = self._state = self._quiet.taken(state)
        return state

    @state.setter
    def state(self, state) -> None:
        if self._quiet.last is not None:
            raise RuntimeError("Loop.state was replaced while quiet steps were not yet in it: read it first")
        self._state, self._quiet.until = state, 0  # the next step is walked, and opens the next quiet stretch

    def _current(self):
        """The state to fold the next event over: a ``StepState`` where a step's hooks left one, not built."""
        return self._state if self._quiet.last is None else self.state

    @property
    def finished(self) -> bool:
        return self._state.finished and self.tx.interrupted is None  # quiet steps never finish a run

    def run(self, steps: int | None):
        """Train ``steps`` more steps, or to the end (``Loop.run``); returns the state."""
        p = self.state.progress
        done = 0
        if self.tx.interrupted is not None:
            if steps == 0:
                return self.state
            self.step()
            done = 1
        elif self.finished or not p.steps_left:
            # A checkpoint of the last step may predate AfterTrain (its save was the deferred
            # epoch-end one): then only the closing events remain, and no step to train.
            if not self._told_finished:
                self.ctx.say(f"training already finished at step {p.global_step}: nothing to do")
            self._told_finished = False
            if self.finished:
                return self.state
        # ``finished``, read cheaply: a step that returned left nothing interrupted, and quiet steps never finish.
        while not self._state.finished and (steps is None or done < steps):
            self.step()
            done += 1
        self.read_waiting()  # the state run() returns holds every output (a NaN among them is said here)
        self.ctx.wait_for_save()  # what run() returns is on disk, as a notebook expects
        return self.state

    def step(self) -> None:
        """One step (``Loop.step``), then a Ctrl-C held back until its end raised, where nothing is in flight.

        Every ``WAIT_AT_MOST``-th step's end reads the outputs that wait
        (``pimm_fn.runtime.engine.outputs``). Then the step's boundary: a preemption request or the time budget
        agreed on by every rank saves and stops (``pimm_fn.runtime.engine.preemption``).
        """
        tx, quiet = self.tx, self._quiet
        self._continue() if tx.interrupted is not None else self._step()
        if quiet.due(quiet.last if quiet.last is not None else global_step_of(self._state)):
            self._read()  # a long epoch no hook reads the outputs of: what waits stays bounded (WAIT_AT_MOST)
        if tx.keys.pending:  # every unit closed behind it: only a held Ctrl-C makes this a safe point to act at
            try:
                tx.keys.safe_point()
            except KeyboardInterrupt:
                tx.stopped_after(self.state.progress.global_step)
                raise
        stopping = self._stopping
        if stopping is not None and (stopping.busy or stopping.requests.reason is not None):
            self._at_boundary(stopping)

    def _at_boundary(self, stopping) -> None:
        """At a step's end: the agreed clock (``Elapsed``) to the hooks that want it, then a stop if one is asked."""
        if self._state.finished:
            return stopping.settle()  # the run ended on its own: its final save holds everything
        quiet = self._quiet
        step = quiet.last if quiet.last is not None else global_step_of(self._state)
        reason, tick = stopping.at_boundary(step)
        if tick is not None:
            self.dispatch(tick)
        if reason is not None:
            self._preempt(stopping, reason)

    def _preempt(self, stopping, reason: str) -> None:
        """Save this step on every rank (unless its own save holds it), say one line, and raise ``Preempted``."""
        ctx, interpreter = self.ctx, self._interpreter
        self.read_waiting()
        state = self.state
        step = state.progress.global_step
        ctx.wait_for_save()
        path = None
        if ctx.save_dir is not None:
            if self.last_saved() != step and (ctx.replicas is None or ctx.replicas.writes):  # one group writes
                effect = preemption_save(step, reason)
                console, ctx.console = ctx.console, False  # one line says it all, below
                try:
                    interpreter.handler_for(effect)(effect, state, ctx)
                finally:
                    ctx.console = console
            path = saved_at(ctx, step)  # its name where it lives (last-<step>-<token> on a store)
        self._close()  # as at training's end: nothing left in flight, every record written, the lock released
        code = stopping.option.exit_code
        saved = f"saved step {step} to {path}" if path is not None else f"stopped at step {step} (no save_dir)"
        ctx.say(f'{reason}: {saved}; exiting with code {code}; continue with loop(..., resume="auto")')
        raise Preempted(code, step, reason, path)

    def last_saved(self) -> int | None:
        """The step of the last checkpoint the hooks saved (every rank's trace holds the same collective saves)."""
        for entry in reversed(self._interpreter.trace):
            if entry.effect.__class__ is SaveCheckpoint:
                return entry.effect.step
        return None

    def read_waiting(self) -> None:
        """Read the outputs waiting on their device (``pimm_fn.runtime.engine.outputs``), if any."""
        if self._quiet.unread:
            self._read()

    def _step(self) -> None:
        quiet = self._quiet
        step = global_step_of(self._state) + 1 if quiet.last is None else quiet.last + 1
        if step <= quiet.until:  # a quiet step: nothing but its training
            return self._driver.train(step)
        while True:
            cls = self._advance()
            if cls is None or cls is ev.AfterStep:
                break
        while self._next_event().__class__ in _CLOSING:
            self._advance()
        if quiet.last is None and self._quiet_steps and self._next_event().__class__ is ev.BeforeStep:
            quiet.open(self.hooks, self._state.progress)  # up to the next step a hook is called for

    def _next_event(self) -> ev.Event | None:
        """``next_event(self.state)``, computed once per state."""
        state = self._current()
        peeked, event = self._peeked
        if peeked is not state:
            event = next_event(state)
            self._peeked = (state, event)
        return event

    def _advance(self) -> type | None:
        """Run the next lifecycle event; returns its class (``AfterStep``: a step trained), or None when training is over.

        A ``BeforeStep`` no hook wants and no guard compares moves nothing but
        the position, and the step's ``AfterStep`` moves that on past it: the
        step is trained at once, with no ``State`` built for it. One the hooks
        see is folded, and its step trained right after (``next_event`` after
        a ``BeforeStep`` is its ``AfterStep``, whatever the hooks did).
        """
        event: Any = self._next_event()  # narrowed by its exact class, below, where mypy does not follow
        cls = event.__class__  # next_event builds exact lifecycle classes
        if self._replicas is not None and (cls is ev.BeforeStep or cls is ev.BeforeEpoch):
            event = self._replicated(event)
            cls = event.__class__
        if cls is ev.BeforeStep and self.processed[ev.BeforeStep]:
            self._hand(event)  # and its step trains at once: a BeforeStep is always followed by its step's AfterStep
            cls = ev.AfterStep
        if cls is ev.AfterStep or cls is ev.BeforeStep:
            try:
                self._driver.train(event.step)  # handed back to _trained: a quiet step's AfterStep is only counted
            except Discarded:  # its vote failed: back to the boundary, dealt again after a new quorum
                self._discarded()
                return ev.BeforeStep
            return ev.AfterStep
        if cls is ev.BeforeEpoch or cls is ev.AfterEpoch:
            feed, self.tx.step = self.ctx.feed, None
            if cls is ev.BeforeEpoch:
                with self._opening:
                    feed.start_epoch(event.epoch)
            else:
                with self._draining:  # a stateful loader is drained at the epoch's end: a fetch
                    feed.end_epoch()
        elif event is None:
            return None
        self.dispatch(event)
        if cls is ev.AfterTrain:
            self._close()
        return cls

    def _replicated(self, event):
        """Under ``FaultTolerance``, before ``event`` (a ``BeforeEpoch`` or ``BeforeStep``): the event next after it.

        Before an epoch, its length for the participants of the last quorum.
        Before a step, the quorum of the replica groups (a heal there
        replaces this run's state with a live peer's), then the epoch's length
        for its participants (``pimm_fn.runtime.replicas.switch``); the
        boundary a discarded step comes back to.
        """
        replicas = self._replicas
        if event.__class__ is ev.BeforeStep:
            replicas.at_boundary()
        self.state = replicas.sized(self.state, self._next_event())
        if event.__class__ is ev.BeforeStep:
            self._boundary = (self._state, torch_rng())
        return self._next_event()

    def _discarded(self) -> None:
        """A step whose vote failed: the state and torch RNG back at its boundary, no batch held (it is dealt again)."""
        if self._boundary is not None:
            state, rng = self._boundary
            self.state = state
            set_torch_rng(rng)
        self.tx.held = None

    def _trained(self, step: int, scalars: dict, size: int) -> None:
        """Hand the trained ``step`` on: counted when it is quiet, else its one ``AfterStep`` folded."""
        if step <= self._quiet.until:  # no hook is called for it: the state takes it when next read
            return self._quiet.count(step, size, scalars)
        outputs: Mapping[str, float] | None = scalars
        if scalars:
            if self.processed[ev.AfterStep] and self.hooks.reads(step):
                self._reading_step = (step, scalars, size)  # its AfterStep, built only if the read fails
                outputs = self._read(step, scalars)  # read before the event is built: it is built once, with floats
                self._reading_step = None
            else:  # no hook reads them up front: they wait, unread, and the hooks see them on demand
                self._quiet.unread.add(step, scalars)
                outputs = (
                    StepOutputs(step, scalars, partial(read_in_place, scalars)) if self.processed[ev.AfterStep] else {}
                )
        self._hand(ev.AfterStep(step, outputs, size))

    def dispatch(self, event) -> None:
        """Hand ``event`` to the hooks and execute their effects; outputs waiting on the device are read first."""
        cls, tx = event.__class__, self.tx
        if cls is ev.AfterStep and event.outputs and event.outputs.__class__ is not StepOutputs:  # a retried step's
            tx.step, tx.event = event.step, event  # a failed read hands it on again
            event = ev.AfterStep(event.step, self._read(event.step, event.outputs), event.batch_size)
        elif cls is ev.AfterEpoch and self._quiet.unread:
            tx.step, tx.event = None, event
            self._read()
        self._hand(event)

    def _hand(self, event) -> None:
        """``dispatch`` of an ``event`` whose outputs are read: folded, its effects executed."""
        cls, tx = event.__class__, self.tx
        # Its driver work is done: after a failure it is handed on again. Its step: step_of(event), inlined.
        tx.step, tx.event = event.step if cls is ev.AfterStep or cls is ev.BeforeStep else None, event
        if self.processed.get(cls, True):
            with self._folding:  # the fold is pure: when it raises nothing changed, and the event folds again
                state, work = start(self.hooks, self._current(), event, self._interpreter)
            tx.event, self.state = None, state
            if work is not None:
                self._finish(work)
        else:  # no hook wants it and no guard compares it: process() would only advance
            tx.event, self.state = None, advance(self._current(), event)
        if cls is ev.AfterStep and event.outputs.__class__ is StepOutputs:
            event.outputs.close()  # its step is over: what no hook read is never read for it

    def _read(self, step: int | None = None, outputs=None) -> dict | None:
        """Every unread output read in one transfer, with ``outputs`` (of ``step``'s ``AfterStep``), as floats.

        Then the NaN check, then the accumulating hooks take the waiting
        ones; returns ``outputs`` read. Nothing is kept until all succeeded: a
        NaN under ``"raise"`` raises again on a retry. Without a step (an
        epoch's end, the end of ``run()``, a hook swap) it reads what waits.
        """
        waiting = step is None and self.tx.event is None  # no event waits for this read
        if waiting:
            self.tx.step = None
        with self._reading_waiting if waiting else self._reading:
            pending, current = self._quiet.read(step, outputs, self.ctx.nonfinite)
        if pending:  # waiting outputs were read: the accumulating hooks take them
            state = self._quiet.accumulated(self.state, self.hooks, pending)
            if state is not self._state:
                self.state = state
        return current

    def _stopped_reading(self, step: int, error: BaseException) -> str:
        """Reading before an event raised: that event (a step's ``AfterStep``, built now) is handed on again."""
        tx, reading = self.tx, self._reading_step
        if tx.event is None and reading is not None:  # the read in _trained, which set _reading_step
            tx.event = ev.AfterStep(*reading)  # its outputs still on their device: read on the retry
            self._reading_step = None
        return f"reading the step outputs before {type(tx.event).__name__}"

    def _finish(self, work) -> None:
        """Execute ``work`` (a ``Pending``) to the end, keeping it where an effect or a follow-up's fold raises.

        Without exact retry (``Training(exact_retry=False)``) no RNG is kept before an effect: a retried one
        draws from the RNG as it is (``ResumeNotExactWarning`` says so).
        """
        tx, exact = self.tx, self.ctx.exact_retry
        while work.frames:
            # Kept for a retry: the work, and the RNG its effect starts from (a retry draws the same numbers).
            tx.work, tx.rng = work, torch_rng() if exact and work.upcoming is not None else None
            tx.step = step_of(work.frames[0].event)
            with self._working:
                if self._quiet.unread and self._saves(work):
                    work = tx.work = self._summed(work)
                work = work.advance(self.hooks, self._interpreter)
        tx.work = tx.rng = None
        self.state = work.state

    def _saves(self, work) -> bool:
        """Whether the next unit of ``work`` saves a checkpoint here (one the guard does not skip)."""
        if work.upcoming.__class__ is not SaveCheckpoint:
            return False
        return not self._interpreter.skips(work.next_effect)

    def _summed(self, work):
        """``work`` whose state holds the outputs that wait, read (a NaN said) before its effect saves a checkpoint.

        So a checkpoint records the hooks' sums of every step it holds, and a
        non-finite loss is said before a checkpoint of a later step is written.
        Only before a save that runs: every rank runs the same saves, so the
        NaN check's all-reduce is met on every rank (a best-weights write is
        the main rank's alone, and the guard skips a save ranks disagree on).
        """
        pending, _ = self._quiet.read(None, None, self.ctx.nonfinite)
        return attrs.evolve(work, state=self._quiet.accumulated(work.state, self.hooks, pending))

    def _stopped_in_work(self, step: int, error: BaseException) -> str:
        """Where the kept work stopped (its effect, or the hook folding a follow-up); the run takes its state."""
        work = self.tx.work
        self.state = work.state
        effect = work.upcoming
        if effect is None:
            return fold_phase(error, work.next_followup)
        return effect_phase(effect) if self.ctx.exact_retry else effect_retried_inexactly(effect)

    def _close(self) -> None:
        """Training ended (or stops for a preemption): no agreement left in flight (pimm_fn's own process groups
        destroyed), every rank learns of a divergence in the last events, every save and record is written (the
        loggers, the bar and the background saver closed), and ``save_dir``'s lock released
        (``pimm_fn.checkpoint.lock``)."""
        if self._stopping is not None:
            self._stopping.close()
        self._interpreter.settle()
        self.ctx.wait_for_save()
        self._interpreter.close()
        if self.ctx.replicas is not None:
            self.ctx.replicas.close()
        if self.ctx.lock is not None:
            self.ctx.lock.release()

    def _continue(self) -> None:
        """``step()`` after an interruption: finish what the step left, then the rest of it."""
        if not self.tx.interrupted.continues:
            raise RuntimeError(f"cannot continue this run: {self.tx.interrupted}")
        if self._recover():
            while self._next_event().__class__ in _CLOSING:
                self._advance()
        else:
            self._step()
        self.tx.interrupted = None

    def _recover(self) -> bool:
        """Do the work an interrupted step left undone; True when that step had trained."""
        tx = self.tx
        if tx.trained is not None:
            self._driver.schedule(*tx.trained)  # and the step handed on
            return True
        event, work = tx.event, tx.work
        if event is not None:
            self.dispatch(event)
        elif work is not None:
            if tx.rng is not None:
                set_torch_rng(tx.rng)
            event = work.frames[0].event
            # The loop's state is the one to continue from: Loop.replace may have changed a slot.
            self._finish(attrs.evolve(work, state=self.state))
        else:
            return False  # interrupted before its training: the step runs as usual, with any batch it drew
        if event.__class__ is ev.AfterTrain:
            self._close()
        return event.__class__ in _TRAINED
