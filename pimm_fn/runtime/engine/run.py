"""A training run in progress: step it, run it, inspect it, fix it and continue.

``Loop`` is what ``pimm_fn.loop`` returns and a user holds: ``step()`` and
``run()`` train, ``state``, ``trace``, ``history`` and ``interrupted`` show
where the run stands (``state`` is always a plain value, so a notebook can
look at it between steps), ``replace`` fixes a hook and goes on. The walk
itself (the lifecycle the pure core defines, the driver's work, the events
handed to the hooks with the interpreter as executor, each step a
transaction) is its ``Walker`` (``pimm_fn.runtime.engine.walker``).
"""

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pimm_fn import notebook
from pimm_fn.core import summary
from pimm_fn.core.state import State
from pimm_fn.core.trace import Trace
from pimm_fn.hooks.evaluation import Evaluator
from pimm_fn.runtime.engine import swap
from pimm_fn.runtime.engine.interpreter import Context, Interpreter
from pimm_fn.runtime.engine.preemption import advise, newest_checkpoint
from pimm_fn.runtime.engine.transaction import Interruption
from pimm_fn.runtime.engine.walker import Walker
from pimm_fn.runtime.errors import Preempted
from pimm_fn.runtime.evaluation import after_training
from pimm_fn.runtime.handlers.logs import clock
from pimm_fn.runtime.logs.history import History

__all__ = ["Loop"]


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
    ``optimizer.step()`` itself, which may have updated some parameters
    (``pimm_fn.runtime.engine.transaction``).

    With several ranks, a failure alike on every rank (same step, same
    phase: a deterministic bug in a hook or handler) continues exactly the
    same way. A failure on some ranks only never hangs the others: the
    group is shut down and every rank raises within seconds (those that did
    not fail: ``PeerFailureError``); rebuild with ``resume="auto"`` (``peers``).

    In a notebook a cell ending in ``run``, ``run.state`` or ``run.trace``
    shows a short summary (``print`` shows the same): step of total, epoch,
    metrics, best values, the last save and train log, each hook by its
    identity beside its slot (``pimm_fn.core.summary``).

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

    def __init__(
        self,
        ctx: Context,
        state: State,
        step_fn: Callable[..., Mapping[str, Any]],
        interpreter: Interpreter,
        *,
        resume: str | os.PathLike | None = None,
        resumed: bool = False,
    ) -> None:
        if ctx.implied is None:
            raise ValueError("Loop: its Context holds no hooks (ctx.implied is None): build the run with loop()")
        self.ctx = ctx
        self._step_fn = step_fn
        self._interpreter = interpreter
        self._resume = resume  # loop()'s: whether running the script again resumes (a script's Ctrl-C says so)
        # A resumed run with nothing left to train was warned about by loop(): its first run() says it no more.
        told = resumed and not state.progress.steps_left
        self._walker = Walker(ctx, state, step_fn, interpreter, told_finished=told)  # it reads ctx.implied's hooks
        self.hooks = ctx.implied.hooks
        # The preemption signals' handlers while it trains (pimm_fn.runtime.engine.preemption); none on a bare Context.
        self._requests = ctx.stopping.requests if ctx.stopping is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _training(self):
        """What ``run()`` and ``step()`` train inside: the Ctrl-C keys, the preemption signals, the log clock.

        Leaving it on an error, pimm_fn's own process group is closed (a run
        that goes on makes another); in a script, a Ctrl-C carries the advice
        its exit prints (``pimm_fn.runtime.engine.preemption.advise``), and a preemption stop
        holds its signals until the process exits with its code
        (``Requests.hold``), outermost: after the loop's own handlers were put back.
        """
        try:
            with self._walker.tx.keys, self._requests, clock(self.ctx.logs):
                yield
        except Preempted:
            self.ctx.stopping.requests.hold()  # raised only by a run that has its Stopping
            raise
        except BaseException as error:
            if self.ctx.stopping is not None:  # pimm_fn's group closed; a run that goes on makes another
                stopped = self.interrupted
                self.ctx.stopping.close(alike=stopped is not None and stopped.continues)
            if isinstance(error, KeyboardInterrupt):
                self._advise(error)
            raise

    def _advise(self, error: KeyboardInterrupt) -> None:
        """Attach to a script's Ctrl-C the one line its exit prints (``pimm_fn.runtime.engine.preemption.advise``)."""
        model_dir = self.ctx.model_dir if self.ctx.save_dir else None
        stopping, stopped = self.ctx.stopping, self.interrupted
        advise(
            error,
            f"during step {stopped.step} ({stopped.phase})"
            if stopped is not None
            else f"after step {self.state.progress.global_step}",
            newest=newest_checkpoint(model_dir),
            model_dir=model_dir,
            auto=self._resume == "auto",
            saves_on_interrupt=stopping is not None and stopping.requests.interrupt,
        )

    def _use(self, implied) -> None:
        """Run on with the hooks of ``implied`` (``pimm_fn.runtime.engine.implied``), as ``replace`` derived it anew."""
        self.ctx.implied, self.hooks = implied, implied.hooks
        self._walker.use(implied)

    @property
    def _processed(self) -> dict:
        """The event classes the hooks must see (some hook wants them, or the guard compares them)."""
        return self._walker.processed

    @property
    def state(self) -> State:
        """The current ``State``; the quiet steps trained since the last event a hook saw are in it."""
        return self._walker.state

    @state.setter
    def state(self, state) -> None:
        self._walker.state = state

    @property
    def history(self) -> History:
        """What the run logged, as columns (``pimm_fn.runtime.logs.history.History``): ``run.history.to_pandas()``."""
        return self.ctx.logs.history

    @property
    def trace(self) -> Trace:
        """The effects executed so far, as a ``Trace``: equal to a list (or ``plan``'s tuple) of the same entries."""
        return Trace(self._interpreter.trace, map(summary.hook_label, self.hooks.hooks))

    @property
    def finished(self) -> bool:
        return self._walker.finished

    @property
    def interrupted(self) -> Interruption | None:
        """Where the last step stopped on an exception, until it is completed; else ``None``."""
        return self._walker.tx.interrupted

    def _dispatch(self, event) -> None:
        """Hand ``event`` to the hooks now: ``loop()`` says so a resumed run begins (``BeforeTrain(resumed=True)``)."""
        self._walker.dispatch(event)

    def step(self) -> State:
        """Train one step, with the events around it (epoch end, training end); returns the state, as ``run()`` does.

        After a stop was requested (``State.stop``) the epoch closes and
        training ends within this call; a call on a stopped run that had not
        closed yet (resumed from a checkpoint of the stopping step) only
        runs the closing events. After an interruption (``interrupted``) it
        completes the interrupted step instead, from where it stopped.
        A Ctrl-C the loop held back (``pimm_fn.runtime.engine.preemption``) is raised
        at the end, where nothing is in flight.
        """
        with self._training():
            self._walker.step()
        return self.state

    def run(self, steps: int | None = None) -> State:
        """Train ``steps`` more steps, or to the end; returns the state.

        After an interruption the first of them completes the interrupted step.
        The returned ``State`` is ``run.state``: a notebook cell ending in
        ``run.run(...)`` shows its summary (progress, metrics, best values,
        slots), as ``print`` does; ``repr`` gives every field.
        """
        with self._training():
            return self._walker.run(steps)

    def __call__(self):
        """Train to the end; returns the final state."""
        return self.run()

    def __repr__(self):
        p = self.state.progress
        hooks = ", ".join(map(summary.hook_label, self.hooks.hooks))  # by identity: no function addresses
        return f"<Loop step {p.global_step}/{p.global_step + p.steps_left}, epoch {p.epoch}, hooks=[{hooks}]>"

    def _rows(self) -> list:
        """The summary a notebook shows: ``pimm_fn.core.summary.run_rows``, and where an interruption stopped."""
        rows = summary.run_rows(self.state, self.hooks.hooks, self._interpreter.trace)
        return rows + [("interrupted", str(self.interrupted))] if self.interrupted is not None else rows

    def __str__(self) -> str:
        return summary.render_text("Loop", self._rows())

    def _repr_pretty_(self, printer, cycle) -> None:
        notebook.pretty(printer, str(self), cycle)

    def _repr_html_(self) -> str:
        return notebook.render_html("Loop", self._rows(), self.state.progress)

    def replace(self, old: Any, new: Any, *, fresh: bool = False) -> "Loop":
        """Swap hook ``old`` (a hook, its identity or its path in chains) for ``new`` in this live run.

        Fix a hook between steps, or after one raised, and ``run()`` on; see
        ``pimm_fn.runtime.engine.swap.replace`` for what carries over and what is
        refused. Returns this ``Loop``: ``run.replace(a, b).run()``.
        """
        self._walker.read_waiting()  # the old hook's sums take what waits, before the new one takes its slot
        swap.replace(self, old, new, fresh=fresh)
        return self

    def test(
        self,
        evaluator: Evaluator,
        *,
        weights: str = "final",
        metric: str | None = None,
    ) -> dict:
        """``evaluator``'s metrics on the ``"final"`` or ``"best"`` weights (``pimm_fn.runtime.evaluation.after_training``)."""
        return after_training.test(self, evaluator, weights=weights, metric=metric)

    def predict(
        self,
        loader: Iterable[Any],
        *,
        forward: Callable[[Any, Any], Any] | None = None,
        weights: str = "final",
        metric: str | None = None,
    ) -> list:
        """The model's outputs for each batch of ``loader``, on the CPU (``pimm_fn.runtime.evaluation.after_training``)."""
        return after_training.predict(self, loader, forward=forward, weights=weights, metric=metric)

    def replace_evaluator(self, name: str, fn: Evaluator) -> "Loop":
        """Swap the function of the ``evaluate_every`` hook whose evaluator is ``name``; see ``replace``."""
        swap.replace_evaluator(self, name, fn)
        return self
