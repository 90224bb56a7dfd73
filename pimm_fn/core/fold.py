"""Folding hooks over an event, and processing an event's effects in order.

``chain`` composes hooks into one hook whose slot is the tuple of the
children's slots (as optax's ``chain`` keeps its children's states).

A hook may declare what it ignores, so the fold can skip it cheaply:

* ``events``: the event types it reacts to;
* ``step_cadence``: n >= 1 when it acts on ``AfterStep(step)`` only for
  ``step % n == 0``, 0 when it never acts on ``AfterStep``. On any other
  ``AfterStep`` it emits nothing and changes nothing but its own slot, and
  only as its ``quiet_step(slot, event) -> slot`` says (no ``quiet_step``: the
  slot stays as it is). The fold calls ``quiet_step`` instead of the hook
  there, so a step on which no cadence fires copies no ``State`` per hook.

``process`` is the one deterministic pass the design rests on: fold every
hook for the event, then hand the collected effects, in (hook position,
emission order), to an executor, dispatching any follow-up events the
executor returns depth-first before the next effect. Effects that say they
``runs_last`` (a deferred epoch-end save, the final save) keep that order
among themselves but come after the event's other effects. The order
depends on the effects' values alone, so it is the same on every rank.
"""

from typing import Any, Callable, Protocol

import attrs

from pimm_fn.core.effects import Effect
from pimm_fn.core.events import AfterStep, Event
from pimm_fn.core.schedule import advance, stepped, stepped_state
from pimm_fn.core.state import State, evolvers, replace

__all__ = ["chain", "Chain", "TraceEntry", "Executor", "fold", "process", "init_slots"]


def init_slot(hook) -> Any:
    """A hook's initial slot: ``hook.init()`` when it has one, else ``None``."""
    init = getattr(hook, "init", None)
    return init() if callable(init) else None


def init_slots(hooks) -> tuple:
    return tuple(init_slot(h) for h in hooks)


def _cares(hook, event_type) -> bool:
    events = getattr(hook, "events", None)
    return events is None or any(issubclass(event_type, t) for t in events)


def _cadence(hook) -> tuple | None:
    """``(step_cadence, quiet_step or None)`` of a hook declaring a cadence, else ``None``."""
    cadence = getattr(hook, "step_cadence", None)
    if cadence is None:
        return None
    if not isinstance(cadence, int) or isinstance(cadence, bool) or cadence < 0:
        raise ValueError(f"hook {hook!r}: 'step_cadence' must be None or an int >= 0 (got {cadence!r})")
    quiet = getattr(hook, "quiet_step", None)
    if quiet is not None and not callable(quiet):
        raise TypeError(f"hook {hook!r}: 'quiet_step' must be callable as quiet_step(slot, event) (got {quiet!r})")
    return cadence, quiet


def _cadences(hooks) -> tuple | None:
    cadences = tuple(_cadence(h) for h in hooks)
    return None if all(c is None for c in cadences) else cadences


def _quiet_plan(chain) -> tuple | None:
    """``(cadences, quiet_slots)`` when every hook wanting ``AfterStep`` declares a cadence, else ``None``.

    Then an ``AfterStep`` no cadence fires on calls no hook: the fold moves on
    with ``quiet_slots(slots, event)``, the slots after every ``quiet_step``
    ran (``None`` when no hook has one), the common step of a long cadence.
    """
    cadences = chain._cadences
    active = chain.active(AfterStep)
    if cadences is None or any(cadences[i] is None for i in active):
        return None
    quiets = {i: cadences[i][1] for i in active if cadences[i][1] is not None}
    if not quiets:
        return tuple(cadences[i][0] for i in active), None
    # One tuple display, generated once per chain: (slots[0], quiet_1(slots[1], event), ...).
    items = ", ".join(
        f"quiet_{i}(slots[{i}], event)" if i in quiets else f"slots[{i}]" for i in range(len(chain.hooks))
    )
    namespace = {f"quiet_{i}": quiet for i, quiet in quiets.items()}
    exec(f"def quiet_slots(slots, event):\n    return ({items},)", namespace)  # noqa: S102 - indices only
    return tuple(cadences[i][0] for i in active), namespace["quiet_slots"]


def _check_result(hook, result):
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], State)):
        raise TypeError(
            f"hook {hook!r} must return (State, tuple_of_effects) (got {type(result).__name__}: {result!r:.200})"
        )
    effects = result[1]
    if not isinstance(effects, tuple) or not all(isinstance(e, Effect) for e in effects):
        raise TypeError(f"hook {hook!r} must return a tuple of Effect values as effects (got {effects!r:.200})")
    return result


@attrs.frozen
class Chain:
    """Hooks run in order as one hook; see ``chain``."""

    hooks: tuple = attrs.field(converter=tuple)
    _active: dict = attrs.field(factory=dict, eq=False, repr=False, hash=False, alias="_active")
    # Each hook's (step_cadence, quiet_step) or None; None when no hook declares a cadence.
    _cadences: tuple | None = attrs.field(
        init=False, eq=False, repr=False, hash=False,
        default=attrs.Factory(lambda self: _cadences(self.hooks), takes_self=True),
    )
    _quiet: tuple | None = attrs.field(
        init=False, eq=False, repr=False, hash=False, default=attrs.Factory(_quiet_plan, takes_self=True),
    )

    def init(self) -> tuple:
        return init_slots(self.hooks)

    def active(self, event_type) -> tuple:
        """Indices of the hooks that want ``event_type``, cached per type."""
        found = self._active.get(event_type)
        if found is None:
            found = self._active[event_type] = tuple(
                i for i, h in enumerate(self.hooks) if _cares(h, event_type)
            )
        return found

    def fold(self, state: State, event: Event, slots: tuple) -> tuple[State, tuple, list]:
        """Fold the hooks over ``event``; returns (state, new slots, [(index, effect)])."""
        state, slots, emitted = self._fold(state, event, slots)
        return (state if state.slot is None else replace(state, slot=None)), slots, emitted

    def _fold(self, state: State, event: Event, slots: tuple, progress=None) -> tuple[State, tuple, list]:
        """``fold`` leaving the last hook's slot in ``state.slot`` (the caller clears it).

        With ``progress``, ``state`` is the state before an ``AfterStep`` and
        ``progress`` its progress after: the first hook called sees them
        joined, in one copy; when none is called, ``state`` comes back as it
        was and the caller applies them.
        """
        emitted = []
        new_slots = None
        hooks = self.hooks
        cls = event.__class__
        active = self._active.get(cls)
        cadences = self._cadences if cls is AfterStep else None
        for i in self.active(cls) if active is None else active:
            slot = (new_slots or slots)[i]
            if cadences is not None and (declared := cadences[i]) is not None:
                cadence, quiet = declared
                if not cadence or event.step % cadence:  # a step the hook's cadence rules out
                    if quiet is not None and (changed := quiet(slot, event)) is not slot:
                        new_slots = list(new_slots or slots)
                        new_slots[i] = changed
                    continue
            hook = hooks[i]
            if progress is not None:
                state = evolvers[state.__class__](state, progress=progress, position="AfterStep", slot=slot)
                progress = None
            elif state.slot is not slot:
                state = evolvers[state.__class__](state, slot=slot)
            result = hook(state, event)
            # Checked inline for the common (state, ()) answer; anything else in full.
            if result.__class__ is tuple and len(result) == 2 and result[1] == () and result[0].__class__ is State:
                state, effects = result
            else:
                state, effects = _check_result(hook, result)
            if state.slot is not slot:
                new_slots = list(new_slots or slots)
                new_slots[i] = state.slot
            if effects:
                emitted.extend((i, e) for e in effects)
        return state, tuple(new_slots) if new_slots else slots, emitted

    def __call__(self, state: State, event: Event):
        outer = state.slot
        state, slots, emitted = self.fold(state, event, outer if outer is not None else self.init())
        return replace(state, slot=slots), tuple(e for _, e in emitted)

    def __repr__(self):
        return f"chain({', '.join(map(repr, self.hooks))})"

    def __reduce__(self):
        # The hooks alone: the caches and the generated quiet_slots are rebuilt from them.
        return (Chain, (self.hooks,))


def chain(*hooks) -> Chain:
    """Compose hooks into one hook that runs them in order.

    Each child sees the state the previous one returned; effects come out in
    (child position, emission order).

    >>> from pimm_fn.hooks import save_every
    >>> chain(save_every(2), save_every(3))
    chain(save_every(2), save_every(3))
    """
    for hook in hooks:
        if not callable(hook):
            raise TypeError(f"a hook must be callable as hook(state, event) (got {hook!r})")
    return Chain(hooks)


@attrs.frozen
class TraceEntry:
    """One executed effect: at global ``step``, during ``event``, from hook ``hook``."""

    step: int
    event: Event
    effect: Effect
    hook: int = -1


class Executor(Protocol):
    """What ``process`` hands effects to: the interpreter, or a pure planner."""

    def check(self, state: State, event: Event, emitted: list) -> None: ...

    def execute(self, state: State, entry: TraceEntry) -> tuple[Event, ...]: ...


def fold(hooks: Chain, state: State, event: Event) -> tuple[State, list]:
    """Apply the core's bookkeeping for ``event``, then fold ``hooks`` over it."""
    if event.__class__ is AfterStep:  # advance's bookkeeping joined to the fold's first State copy
        before, progress = state, stepped(state.progress, event)
        if (quiet := hooks._quiet) is not None:
            step = event.step
            for n in quiet[0]:
                if n and not step % n:
                    break
            else:  # no cadence fires: no hook is called, only the quiet_steps run
                slots = state.slots if quiet[1] is None else quiet[1](state.slots, event)
                return stepped_state(state, progress, slots), []
        state, slots, emitted = hooks._fold(state, event, state.slots, progress)
        if state is before:  # no hook was called: one copy for the progress, position and slots
            return stepped_state(state, progress, slots), emitted
    else:
        state = advance(state, event)
        state, slots, emitted = hooks._fold(state, event, state.slots)
    if len(emitted) > 1 and any(e.runs_last for _, e in emitted):
        emitted.sort(key=lambda pair: pair[1].runs_last)  # stable: positions kept within each group
    if slots is not state.slots:
        state = evolvers[state.__class__](state, slots=slots, slot=None)
    elif state.slot is not None:
        state = evolvers[state.__class__](state, slot=None)
    return state, emitted


def process(hooks: Chain, state: State, event: Event, executor: Executor) -> State:
    """Fold ``event`` through ``hooks`` and execute its effects, follow-ups included.

    Effects run after *all* hooks have seen the event. A follow-up event an
    effect produces (``MetricsPublished`` after ``Evaluate``) is processed in
    full before the next effect, so a save after an evaluation records the
    hooks' reaction to it.
    """
    state, emitted = fold(hooks, state, event)
    # Called on every event, even one this rank emitted nothing for: another
    # rank may have, and the run-time guard must compare them all.
    executor.check(state, event, emitted)
    for index, effect in emitted:
        followups = executor.execute(state, TraceEntry(state.progress.global_step, event, effect, index))
        for follow in followups:
            state = process(hooks, state, follow, executor)
    return state


Hook = Callable[[State, Event], tuple[State, tuple[Effect, ...]]]
