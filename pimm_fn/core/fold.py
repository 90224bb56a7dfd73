"""Folding hooks over an event: ``chain`` and the core's ``fold``.

``chain`` composes hooks into one hook whose slot is the tuple of the
children's slots (as optax's ``chain`` keeps its children's states).

The fold honours each hook's subscription as ``pimm_fn.core.hook`` reads it:
a hook is called only for the event types it declares, and for an
``AfterStep`` only on its cadence (``every``); on the steps its cadence skips
only its ``accumulate`` runs, on the step's outputs. A step no cadence fires
on calls no hook at all. A nested ``chain`` declares the union of its
children's subscriptions and enforces theirs inside, so nesting changes
nothing.

A hook declaring ``update(slot, state, event)`` is handed its slot apart
from the shared state, as optax hands each transformation its own state:
one that returns its slot and state unchanged builds nothing, and a new slot
lands in the slots without a ``State`` copy. A plain ``hook(state, event)``
finds its slot in ``state.slot``, put there by a copy when another is there. What a
hook returns is checked by ``pimm_fn.core.hook_results``.

``fold`` applies the core's bookkeeping for an event and folds the hooks
over it, returning the new state and the effects in (hook position,
emission order). The order they run in, and executing them resumably, is
``pimm_fn.core.processing``'s.
"""

from collections.abc import Iterable, Sequence
from typing import Any, Callable, cast

import attrs

from pimm_fn.core import hook as protocol
from pimm_fn.core import hook_list
from pimm_fn.core.effects import Effect
from pimm_fn.core.events import AfterStep, BeforeStep, Event
from pimm_fn.core.hook_list import check_hooks
from pimm_fn.core.hook_results import checked_result, checked_update
from pimm_fn.core.outputs import StepOutputs
from pimm_fn.core.schedule import advance
from pimm_fn.core.state import State
from pimm_fn.core.step_state import StepState, stepping, unevolvable
from pimm_fn.core.trace import TraceEntry  # defined beside Trace; importable from here as before

_NEVER = 2**63  # the step no cadence reaches

__all__ = ["chain", "Chain", "TraceEntry", "fold", "init_slots", "called_plainly"]


def init_slots(hooks: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(protocol.init_slot(h) for h in hooks)


def called_plainly(hook: Any, state: State, event: Event) -> tuple[State, tuple[Any, ...]]:
    """``hook(state, event)`` of a hook that declares ``update``: its slot read from and returned in ``state.slot``.

    What such a hook's ``__call__`` is, so calling it directly (a test, a
    wrapper) gives what the fold gives.

    >>> from pimm_fn.core.events import BeforeTrain
    >>> from pimm_fn.core.state import Progress
    >>> class Count:
    ...     def update(self, slot, state, event): return slot + 1, state, ()
    ...     def __call__(self, state, event): return called_plainly(self, state, event)
    >>> Count()(State(Progress(2, 1), slot=0), BeforeTrain())[0].slot
    1
    """
    slot, state_out, effects = checked_update(hook, hook.update(state.slot, state, event))
    return (state_out if state_out.slot is slot else state_out.with_slot(slot)), effects


def _declare(chain: "Chain") -> tuple[protocol.Declared, ...]:
    return tuple(protocol.declared(h) for h in chain.hooks)


def _step_subscribers(chain: "Chain") -> tuple[tuple[int, int, Any], ...]:
    """``(index, every, accumulate)`` of each child called for ``AfterStep``, in order."""
    return tuple((i, d.every, d.accumulate) for i, d in enumerate(chain._declared) if d.wants(AfterStep))


def _step_calls_of(chain: "Chain") -> tuple[tuple[int, tuple[int, Any, Any]], ...]:
    """``(every, call)`` of each child called for ``AfterStep``, ``call`` as ``Chain.calls`` gives it."""
    return tuple((chain._declared[call[0]].every, call) for call in chain.calls(AfterStep))


def _every_step_calls_of(chain: "Chain") -> tuple[tuple[int, Any, Any], ...] | None:
    """``Chain.calls(AfterStep)`` when every child called for ``AfterStep`` is called on every step, else ``None``."""
    if all(every == 1 for every, _ in chain._step_calls):
        return chain.calls(AfterStep)
    return None


def _cadences_of(chain: "Chain") -> tuple[int, ...]:
    """The distinct cadences of the children, smallest first: a step fires when one divides it."""
    return tuple(sorted({every for _, every, _ in chain._step}))


def _reading_cadences_of(chain: "Chain") -> tuple[int, ...]:
    """The cadences, at any depth, of the children that read a step's outputs when called for it."""
    found: set[int] = set()
    for hook, d in zip(chain.hooks, chain._declared):
        if d.wants(AfterStep) and d.reads_outputs:
            found.update(hook._reading if isinstance(hook, Chain) else (d.every,))
    return tuple(sorted(found))


def _accumulators_of(chain: "Chain") -> tuple[tuple[int, int, Any], ...]:
    """The ``(index, every, accumulate)`` of ``_step`` whose child accumulates the steps its cadence skips."""
    return tuple(entry for entry in chain._step if entry[2] is not None)


def _cached(factory: Callable[["Chain"], Any]) -> Any:
    return attrs.field(init=False, eq=False, repr=False, hash=False, default=attrs.Factory(factory, takes_self=True))


@attrs.frozen
class Chain:
    """Hooks run in order as one hook; see ``chain``."""

    hooks: tuple[Any, ...] = attrs.field(converter=tuple)
    name: str | None = None
    _calls: dict[type, tuple[tuple[int, Any, Any], ...]] = attrs.field(
        factory=dict, eq=False, repr=False, hash=False, alias="_calls"
    )
    _declared: tuple[protocol.Declared, ...] = _cached(_declare)
    _step: tuple[tuple[int, int, Any], ...] = _cached(_step_subscribers)
    _cadences: tuple[int, ...] = _cached(_cadences_of)
    _accumulators: tuple[tuple[int, int, Any], ...] = _cached(_accumulators_of)
    _reading: tuple[int, ...] = _cached(_reading_cadences_of)
    _step_calls: tuple[tuple[int, tuple[int, Any, Any]], ...] = _cached(_step_calls_of)
    _every_step_calls: tuple[tuple[int, Any, Any], ...] | None = _cached(_every_step_calls_of)

    # -- the hook protocol, derived from the children ---------------------------------------------
    @property
    def children(self) -> tuple[Any, ...]:
        return self.hooks

    def with_children(self, hooks: Iterable[Any]) -> "Chain":
        return Chain(hooks, self.name)

    @property
    def hook_key(self) -> str:
        """Its ``name``, or its children's identities: the same in every process (no function addresses)."""
        if self.name is not None:
            return self.name
        return f"chain({', '.join(protocol.key(h) for h in self.hooks)})"

    @property
    def events(self) -> tuple[type, ...] | None:
        return hook_list.union_events(self._declared)

    @property
    def every(self) -> int:
        return hook_list.common_every(self._declared, AfterStep)

    @property
    def accumulate(self) -> Callable[[tuple[Any, ...], Any], tuple[Any, ...]] | None:
        return self._accumulate if self._accumulators else None

    @property
    def accumulate_all(self) -> Callable[[tuple[Any, ...], Sequence[Any]], tuple[Any, ...]] | None:
        return self._accumulate_all if self._accumulators else None

    @property
    def rank_consistent(self) -> bool:
        return all(d.rank_consistent for d in self._declared)

    @property
    def emits(self) -> tuple[type, ...] | None:
        return hook_list.union_emits(self._declared)

    @property
    def reads_metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m for d in self._declared for m in d.reads_metrics))

    def init(self) -> tuple[Any, ...]:
        return init_slots(self.hooks)

    # -- folding ----------------------------------------------------------------------------------
    def active(self, event_type: type) -> tuple[int, ...]:
        """Indices of the hooks that want ``event_type`` (read off ``calls``' cache)."""
        return tuple(call[0] for call in self.calls(event_type))

    def calls(self, event_type: type) -> tuple[tuple[int, Any, Any], ...]:
        """``(index, hook, update)`` of the hooks that want ``event_type``, cached per type: what the fold calls.

        ``update`` is the hook's ``update`` (its slot handed apart), or ``None``: called as ``hook(state, event)``.
        """
        found = self._calls.get(event_type)
        if found is None:
            pairs = enumerate(zip(self.hooks, self._declared))
            found = self._calls[event_type] = tuple((i, h, d.update) for i, (h, d) in pairs if d.wants(event_type))
        return found

    def fires(self, step: int) -> bool:
        """Whether some child is called for ``AfterStep(step)``."""
        for every in self._cadences:
            if not step % every:
                return True
        return False

    @property
    def fires_every_step(self) -> bool:
        """Whether some child is called for every ``AfterStep``: then no step is quiet."""
        return self._cadences[:1] == (1,)

    def next_call(self, step: int) -> int:
        """The first step after ``step`` for whose ``AfterStep`` some child is called (a huge number: none)."""
        return min(((step // every + 1) * every for every in self._cadences), default=_NEVER)

    def reads(self, step: int) -> bool:
        """Whether some child called for ``AfterStep(step)`` reads its outputs (``reads_outputs``)."""
        for every in self._reading:
            if not step % every:
                return True
        return False

    @property
    def reads_outputs(self) -> bool:
        return bool(self._reading)

    def _accumulate_all(self, slots: tuple[Any, ...] | list[Any], steps: Sequence[Any]) -> tuple[Any, ...]:
        """``_accumulate`` over ``steps`` (non-empty outputs, in step order), one call per child declaring a batch."""
        slots = list(slots)
        for i, _, accumulate in self._accumulators:
            many = self._declared[i].accumulate_all
            if many is not None:
                slots[i] = many(slots[i], steps)
            else:
                for outputs in steps:
                    slots[i] = accumulate(slots[i], outputs)
        return tuple(slots)

    def _accumulate(self, slots: tuple[Any, ...] | list[Any], outputs: Any) -> tuple[Any, ...]:
        """``slots`` with every accumulating child's ``accumulate`` applied to ``outputs``."""
        slots = list(slots)
        for i, _, accumulate in self._accumulators:
            slots[i] = accumulate(slots[i], outputs)
        return tuple(slots)

    def fold(
        self, state: State, event: Event, slots: tuple[Any, ...]
    ) -> tuple[State, tuple[Any, ...], list[tuple[int, Effect]]]:
        """Fold the hooks over ``event``; returns (state, new slots, [(index, effect)])."""
        state, slots, emitted = self._fold(state, event, slots)
        return (state if state.slot is None else state.with_slot(None)), slots, emitted

    def _fold(
        self, state: Any, event: Event, slots: tuple[Any, ...]
    ) -> tuple[Any, tuple[Any, ...], list[tuple[int, Effect]]]:
        """``fold`` leaving a hook's slot in ``state.slot`` (the caller clears it).

        A child declaring ``update`` is handed its slot apart and the state as
        it is; a plain one finds its slot in ``state.slot``, put there (one
        copy) when another is there. Either way a child that returns its
        slot and state unchanged builds nothing.
        """
        emitted: list[tuple[int, Effect]] = []
        new_slots: list[Any] | None = None
        called: Sequence[tuple[int, Any, Any]] | None
        effects: tuple[Effect, ...]
        cls = event.__class__
        if cls is AfterStep:
            after = cast(AfterStep, event)  # the class is AfterStep
            step, outputs = after.step, after.outputs
            called = self._every_step_calls  # no cadence to test: each is called on every step
            if called is None:
                called = [call for every, call in self._step_calls if not step % every]
            if outputs and outputs.__class__ is not StepOutputs:  # a real run's unread ones wait: summed when read
                for i, every, accumulate in self._accumulators:
                    if step % every:  # a step the cadence skips: only the outputs count
                        new_slots = new_slots or list(slots)
                        new_slots[i] = accumulate(new_slots[i], outputs)
        else:
            called = self._calls.get(cls)
            if called is None:
                called = self.calls(cls)
        # ``hook`` keeps its name: ``runtime.transaction.failing_hook`` reads it off a traceback.
        try:
            for i, hook, update in called:
                slot = (new_slots or slots)[i]
                if update is not None:
                    result = update(slot, state, event)
                    # Checked inline for the common answer, its state unchanged and no effects; anything else in full.
                    if result.__class__ is tuple and len(result) == 3 and result[1] is state and result[2] == ():
                        new, effects = result[0], ()
                    else:
                        new, state, effects = checked_update(hook, result)
                else:
                    if state.slot is not slot:
                        state = state.with_slot(slot)
                    result = hook(state, event)
                    # Checked inline for the common (state, ()) answer; anything else in full.
                    if (
                        result.__class__ is tuple
                        and len(result) == 2
                        and result[1] == ()
                        and (result[0].__class__ is StepState or result[0].__class__ is State)
                    ):
                        state, effects = result
                    else:
                        state, effects = checked_result(hook, result)
                    new = state.slot
                if new is not slot:
                    new_slots = new_slots or list(slots)
                    new_slots[i] = new
                if effects:
                    emitted.extend((i, e) for e in effects)
        except attrs.exceptions.NotAnAttrsClassError as error:  # the hook handed the state it was given to attrs?
            if state.__class__ is StepState and repr(StepState) in str(error):  # attrs names the class it refused
                raise unevolvable(hook) from error
            raise
        return state, tuple(new_slots) if new_slots else slots, emitted

    def update(
        self, slot: tuple[Any, ...] | None, state: State, event: Event
    ) -> tuple[tuple[Any, ...], State, tuple[Effect, ...]]:
        """The hook protocol's ``update``: the children's slots as one tuple, handed apart from ``state``."""
        state, slots, emitted = self._fold(state, event, slot if slot is not None else self.init())
        return slots, state, tuple(e for _, e in emitted)

    def __call__(self, state: State, event: Event) -> tuple[State, tuple[Effect, ...]]:
        return called_plainly(self, state, event)

    def __repr__(self) -> str:
        named = f", name={self.name!r}" if self.name is not None else ""
        return f"chain({', '.join(map(repr, self.hooks))}{named})"

    def __reduce__(self) -> tuple[type["Chain"], tuple[tuple[Any, ...], str | None]]:
        # The hooks alone: the caches are rebuilt from them.
        return (Chain, (self.hooks, self.name))


def chain(*hooks: Any, name: str | None = None) -> Chain:
    """Compose hooks into one hook that runs them in order.

    Each child sees the state the previous one returned; effects come out in
    (child position, emission order). A chain behaves the same at any depth
    of nesting. ``name`` gives it a stable identity of its own (its slot in a
    checkpoint is kept under that name), which also names a single hook:
    ``chain(my_hook, name="progress")``.

    Raises:
        TypeError: a child is not a hook (or is an uncalled hook factory).
        DuplicateHookError: two children have the same identity.

    >>> from pimm_fn.hooks import save_every
    >>> chain(save_every(2), save_every(3))
    chain(save_every(2), save_every(3))
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"chain: 'name' must be a non-empty str (got {name!r})")
    return Chain(check_hooks(hooks, "chain"), name)


def fold(hooks: Chain, state: Any, event: Event) -> tuple[Any, list[tuple[int, Effect]]]:
    """Apply the core's bookkeeping for ``event``, then fold ``hooks`` over it.

    ``state`` is a ``State`` or a ``StepState``. A step's events (``BeforeStep``,
    ``AfterStep``) are folded over a ``StepState`` and give one back, unless a
    hook built a ``State`` (``evolve``); any other event is folded over a ``State``
    (``pimm_fn.core.step_state``).
    """
    if event.__class__ is AfterStep:  # the step counted on a StepState: its progress built when read
        state = stepping(state).stepped(event.step, event.batch_size)
        if not hooks.fires(event.step):  # no hook is called: only the accumulators see the outputs
            if hooks._accumulators and event.outputs and event.outputs.__class__ is not StepOutputs:
                state = state.with_slots(hooks._accumulate(state.slots, event.outputs))
            return state, []
    else:
        # A BeforeStep moves a StepState; advance builds a State for any other event.
        state = advance(stepping(state) if event.__class__ is BeforeStep else state, event)
    state, slots, emitted = hooks._fold(state, event, state.slots)
    if slots is not state.slots:
        state = state.with_slots(slots)
    elif state.slot is not None:
        state = state.with_slot(None)
    return state, emitted


Hook = Callable[[State, Event], tuple[State, tuple[Effect, ...]]]
