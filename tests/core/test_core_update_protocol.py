"""A hook's ``update(slot, state, event)``: its slot handed apart, the same folds as ``hook(state, event)``, no copies."""

import pathlib
import sys

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.fold import called_plainly, chain, fold
from pimm_fn.core.plan import initial_state
from pimm_fn.core.state import Progress, State
from pimm_fn.hooks import log_every
from pimm_fn.runtime.engine.transaction import failing_hook

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _hook_forms import Count, Plain  # noqa: E402


@attrs.frozen
class Quiet:
    """Keeps a slot, returns it and the state unchanged."""

    i: int
    events = (ev.AfterStep, ev.BeforeStep)

    def init(self):
        return (self.i,)  # its own object: a slot no other hook shares

    def update(self, slot, state, event):
        return slot, state, ()

    __call__ = called_plainly


def test_a_hook_returning_its_slot_and_state_unchanged_builds_no_state():
    """Ten slotted update-form hooks that change nothing hand back the very state and slots they were given."""
    hooks = chain(*[Quiet(i) for i in range(10)])
    state = initial_state(hooks.hooks, iters_per_epoch=5, max_epochs=1)
    slots = state.slots
    for event in (ev.BeforeStep(1), ev.AfterStep(1)):
        new_slots, after, effects = hooks.update(slots, state, event)
        assert after is state and new_slots is slots and effects == ()


def test_the_plain_form_of_a_slotted_hook_copies_the_state_to_hand_it_its_slot():
    """The same hooks called as hook(state, event) each need the state rebuilt around their slot: the cost avoided."""
    hooks = chain(*[Plain(Quiet(i)) for i in range(10)])
    state = initial_state(hooks.hooks, iters_per_epoch=5, max_epochs=1)
    new_slots, after, effects = hooks.update(state.slots, state, ev.BeforeStep(1))
    assert after is not state and new_slots is state.slots and after.slot == (9,)


def test_a_fold_over_unchanging_update_hooks_keeps_the_slots_tuple():
    """fold() of an AfterStep makes its one progress copy; the slots tuple is the one it was given, no running slot."""
    hooks = chain(*[Quiet(i) for i in range(10)])
    state = initial_state(hooks.hooks, iters_per_epoch=5, max_epochs=1)
    state = attrs.evolve(state, position="BeforeStep")
    after, emitted = fold(hooks, state, ev.AfterStep(1, {"loss": 1.0}))
    assert after.slots is state.slots and after.slot is None and emitted == []
    assert after.progress.global_step == 1 and after.position == "AfterStep"


def test_a_new_slot_lands_in_slots_and_the_running_slot_is_cleared():
    """An update that returns a new slot changes slots[i] only; the state the fold returns has slot None."""
    hooks = chain(Quiet(0), Count("c", n=1), Plain(Count("d", n=1)))
    state = initial_state(hooks.hooks, iters_per_epoch=5, max_epochs=1)
    after, emitted = fold(hooks, state, ev.ModifyConfig())
    assert after.slots == ((0,), 1, 1) and after.slot is None
    assert after.config["c"] == 1 and after.config["d"] == 1
    assert [e.kind for _, e in emitted] == ["c", "d"]


def test_called_plainly_returns_the_new_slot_in_state_slot():
    """A converted hook called directly, as hook(state, event), still reads and returns its slot in state.slot."""
    hook = log_every(10)
    state = State(Progress(5, 1, global_step=1, iter_in_epoch=1), slot=hook.init())
    after, effects = hook(state, ev.AfterStep(1, {"loss": 2.0}))
    assert after.slot.sums["loss"] == 2.0 and after.slot.count == 1 and effects[0].kind == "train"
    same, none = Count("x", n=5)(attrs.evolve(state, slot=3), ev.BeforeTrain())
    assert same.slot == 4 and none == ()


@pytest.mark.parametrize(
    "result, message",
    [
        ((0, None, ()), r"must return \(slot, State, tuple_of_effects\)"),
        ((0, "state"), r"must return \(slot, State, tuple_of_effects\)"),
        ("state", r"must return \(slot, State, tuple_of_effects\)"),
        (None, r"must return \(slot, State, tuple_of_effects\)"),
    ],
)
def test_a_malformed_update_result_raises_naming_the_hook(result, message):
    """update must return (slot, State, effects); anything else is a TypeError naming the hook."""

    @attrs.frozen
    class Bad:
        events = (ev.BeforeTrain,)

        def update(self, slot, state, event):
            return result

        __call__ = called_plainly

    hooks = chain(Bad())
    with pytest.raises(TypeError, match=r"Bad\(\).*" + message):
        fold(hooks, initial_state(hooks.hooks, iters_per_epoch=2, max_epochs=1), ev.BeforeTrain())


def test_effects_that_are_not_effects_are_refused():
    """The effects of update must be a tuple of Effect values."""

    @attrs.frozen
    class Bad:
        def update(self, slot, state, event):
            return slot, state, ["not an effect"]

        __call__ = called_plainly

    hooks = chain(Bad())
    with pytest.raises(TypeError, match="tuple of Effect values"):
        fold(hooks, initial_state(hooks.hooks, iters_per_epoch=2, max_epochs=1), ev.ModifyConfig())


def test_an_update_that_is_not_callable_is_refused_at_chain_construction():
    """'update' is read with the other declarations: a non-callable fails when the chain is built."""

    def hook(state, event):
        return state, ()

    hook.update = 3
    with pytest.raises(TypeError, match=r"'update' must be callable as update\(slot, state, event\)"):
        chain(hook)


def test_the_hook_an_update_raised_in_is_found_on_the_traceback():
    """A failure inside update (nested chains included) names that hook, as for the plain form."""

    @attrs.frozen
    class Boom:
        def update(self, slot, state, event):
            raise RuntimeError("boom")

        __call__ = called_plainly

    boom = Boom()
    hooks = chain(Quiet(0), chain(Count("c"), boom, name="inner"))
    with pytest.raises(RuntimeError) as info:
        fold(hooks, initial_state(hooks.hooks, iters_per_epoch=2, max_epochs=1), ev.ModifyConfig())
    assert failing_hook(info.value) is boom


_outputs = st.dictionaries(st.sampled_from(["loss", "lr", "acc"]), st.floats(-1e6, 1e6, allow_nan=False), max_size=3)


@given(first=st.lists(_outputs, max_size=4), steps=st.lists(_outputs, max_size=12))
def test_log_every_accumulates_a_batch_of_steps_as_one_step_at_a_time(first, steps):
    """accumulate_all over quiet steps' outputs equals accumulate on each in order: the same sums, bit for bit."""
    from functools import reduce

    hook = log_every(5)
    slot = reduce(hook.accumulate, [o for o in first if o], hook.init())  # any slot, partial counts included
    assert hook.accumulate_all(slot, steps) == reduce(hook.accumulate, [o for o in steps if o], slot)


@given(steps=st.lists(_outputs.filter(bool), max_size=8))
def test_a_chain_accumulates_a_batch_with_or_without_a_childs_batch_form(steps):
    """Chain._accumulate_all equals _accumulate step by step, for children with and without accumulate_all."""
    hooks = chain(log_every(5), Plain(log_every(7)), chain(log_every(3), name="inner"))
    slots = hooks.init()
    one_by_one = slots
    for outputs in steps:
        one_by_one = hooks._accumulate(one_by_one, outputs)
    assert hooks._accumulate_all(slots, steps) == one_by_one
