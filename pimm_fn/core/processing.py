"""Processing an event's effects in their one order, resumably: ``process``, ``start``, ``finish``.

The order of effects, the one the loop, ``plan`` and ``simulate`` share
(``docs/hooks.md``, *The order of effects*, says it for users):

1. Every hook sees the event first (``pimm_fn.core.fold``, in list order);
   only then do the effects they emitted run.
2. An event's effects run in four groups, each in (hook position,
   emission order): first its records (``Log``, ``runs_first``), which hold
   only what the hooks knew when they saw the event, so the lines that
   report an event come before what it causes; then its other effects;
   then the effects that close it (``runs_last``: every checkpoint save),
   so a checkpoint records all its event did, wherever its saver stands;
   last those that must find its checkpoint written (``runs_after_saves``:
   a ``Call(..., after_saves=True)``).
3. The follow-up events an effect returns (``Evaluate`` ->
   ``MetricsPublished``, ``Stop`` -> ``StopRequested``) are processed in
   full, by the same rules, right after it and before the event's next
   effect. So an evaluation's line comes before the new best and the stop
   it causes (records first, within its follow-up), and a save later in
   the event records the hooks' reaction to the evaluation.

The order reads the hook positions, the emission order, the follow-up
structure and each effect's group (a property of its value), never timing,
the rank or a rank-local dict, so it is the same on every rank.

The pass is resumable: ``start`` folds the event and returns the work left
as a ``Pending`` value (an explicit stack of events with the effects and
follow-ups still to run); ``Pending.advance`` does one unit of it. An
exception in an effect leaves the last ``Pending`` valid, and advancing it
again continues exactly where the pass stopped: no effect runs twice, none
is skipped. ``process`` is ``start`` then ``finish``, for ``plan``, the
simulator and a driver alike.
"""

from typing import Any, Protocol

import attrs

from pimm_fn.core import events as ev  # noqa: F401 - the docstring's examples use it
from pimm_fn.core.effects import Effect
from pimm_fn.core.events import Event
from pimm_fn.core.fold import Chain, fold
from pimm_fn.core.state import State
from pimm_fn.core.step_state import built
from pimm_fn.core.trace import TraceEntry

__all__ = ["Executor", "Frame", "Pending", "in_order", "start", "finish", "process"]


def _group(pair: tuple[int, Effect]) -> int:
    effect = pair[1]
    return 0 if effect.runs_first else 3 if effect.runs_after_saves else 2 if effect.runs_last else 1


def in_order(emitted: list[tuple[int, Effect]]) -> list[tuple[int, Effect]]:
    """``emitted`` (``(hook index, effect)`` pairs, as the fold gives them) in the order they run; see the module.

    >>> from pimm_fn.core.effects import Log, SaveCheckpoint, Stop
    >>> emitted = [(0, SaveCheckpoint(4, deferred=True)), (1, Stop(4)), (2, Log(4, "epoch", {}))]
    >>> [(i, type(effect).__name__) for i, effect in in_order(emitted)]
    [(2, 'Log'), (1, 'Stop'), (0, 'SaveCheckpoint')]
    """
    if len(emitted) > 1:
        groups = [_group(pair) for pair in emitted]
        if groups != sorted(groups):
            return [pair for _, pair in sorted(zip(groups, emitted), key=lambda g: g[0])]  # stable: positions kept
    return emitted


class Executor(Protocol):
    """What ``process`` hands effects to: the interpreter, or a pure planner."""

    def check(self, state: State, event: Event, emitted: list[tuple[int, Effect]]) -> None: ...

    def execute(self, state: State, entry: TraceEntry) -> tuple[Event, ...]: ...


@attrs.frozen
class Frame:
    """An event in processing: its effects not yet executed, and the follow-ups
    the last executed one returned that are not yet processed (next first)."""

    event: Event
    effects: tuple[tuple[int, Effect], ...]  # ((hook index, effect), ...)
    followups: tuple[Event, ...] = ()


@attrs.frozen
class Pending:
    """What is left of processing an event, as a value: ``process`` stopped anywhere.

    ``frames`` is the work stack, innermost last: the event's frame, above it
    the frame of a follow-up being processed, and so on. ``state`` is what
    the next effect runs against (follow-ups fold into it). ``advance`` does
    one unit of work (execute the next effect, or fold the next follow-up)
    and returns what is left; when it raises, this value is unchanged, so
    advancing it again retries exactly that unit. Executing an effect is the
    only impure part, and it is the executor's.

    >>> from pimm_fn.core.effects import Log
    >>> from pimm_fn.core.state import Progress
    >>> work = Pending(State(Progress(4, 1)), (Frame(ev.BeforeTrain(), ((0, Log(0, "train", {})),)),))
    >>> work.next_effect.effect.kind, work.done
    ('train', False)
    """

    state: State
    frames: tuple[Frame, ...]

    @property
    def done(self) -> bool:
        return not self.frames

    @property
    def upcoming(self) -> Effect | None:
        """The effect the next ``advance`` executes, or ``None`` when it folds a follow-up (``next_effect`` bare)."""
        top = self.frames[-1]
        return None if top.followups else top.effects[0][1]

    @property
    def next_effect(self) -> TraceEntry | None:
        """The effect the next ``advance`` executes, as its trace entry, or ``None`` when it folds a follow-up."""
        top = self.frames[-1]
        if top.followups:
            return None
        index, effect = top.effects[0]
        return TraceEntry(self.state.progress.global_step, top.event, effect, index)

    @property
    def next_followup(self) -> Event | None:
        """The follow-up event the next ``advance`` folds, or ``None`` when it executes an effect."""
        top = self.frames[-1]
        return top.followups[0] if top.followups else None

    def advance(self, hooks: Chain, executor: "Executor") -> "Pending":
        """Do the next unit of work; see the class docstring."""
        state, frames = self.state, self.frames
        top = frames[-1]
        below = frames[:-1]
        if top.followups:
            follow = top.followups[0]
            state, emitted = fold(hooks, state, follow)
            emitted = in_order(emitted)
            executor.check(state, follow, emitted)
            frames = below + (Frame(top.event, top.effects, top.followups[1:]),)
            if emitted:
                frames += (Frame(follow, tuple(emitted)),)
        else:
            (index, effect), rest = top.effects[0], top.effects[1:]
            followups = executor.execute(state, TraceEntry(state.progress.global_step, top.event, effect, index))
            frames = below + (Frame(top.event, rest, tuple(followups)),)
        while frames and not frames[-1].effects and not frames[-1].followups:
            frames = frames[:-1]
        return Pending(state, frames)


def start(hooks: Chain, state: Any, event: Event, executor: "Executor") -> tuple[Any, Pending | None]:
    """Fold ``event`` and hand its effects to ``executor.check``; returns (state, work left or ``None``).

    The state is a ``StepState`` after a step's event that left no work (``fold``), else a ``State``.

    Raises what a hook raises, with nothing changed: the fold is pure.
    """
    state, emitted = fold(hooks, state, event)
    if emitted:  # in their order, run against a State (a step's fold may give a StepState)
        emitted, state = in_order(emitted), built(state)
    # Called on every event, even one this rank emitted nothing for: another
    # rank may have, and the run-time guard must compare them all.
    executor.check(state, event, emitted)
    return state, (Pending(state, (Frame(event, tuple(emitted)),)) if emitted else None)


def finish(hooks: Chain, work: Pending, executor: "Executor") -> State:
    """Advance ``work`` until nothing is left; returns the state it leaves."""
    while work.frames:
        work = work.advance(hooks, executor)
    return work.state


def process(hooks: Chain, state: State, event: Event, executor: Executor) -> State:
    """Fold ``event`` through ``hooks`` and execute its effects, follow-ups included.

    Effects run after *all* hooks have seen the event, in the order the
    module describes (``in_order``); a follow-up event an effect produces
    (``MetricsPublished`` after ``Evaluate``) is processed in full before
    the next effect, so a save after an evaluation records the hooks'
    reaction to it. The work is ``start`` then ``finish``: a driver
    that must survive an exception anywhere calls them itself, keeping the
    ``Pending`` value to continue from.
    """
    state, work = start(hooks, state, event, executor)
    return built(state) if work is None else finish(hooks, work, executor)
