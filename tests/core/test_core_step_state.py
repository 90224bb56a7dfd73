"""A step's state: what the hooks of ``BeforeStep`` and ``AfterStep`` are handed, a ``State`` built only when needed."""

import copy
import pickle

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Log
from pimm_fn.core.fold import chain, fold
from pimm_fn.core.plan import initial_state
from pimm_fn.core.processing import process
from pimm_fn.core.state import Progress, State
from pimm_fn.core.schedule import next_event
from pimm_fn.core.step_state import StepState, built, global_step_of, stepping


def _base():
    return State(
        Progress(4, 2, epoch=0, iter_in_epoch=1, global_step=1),
        rank=1,
        world_size=2,
        metrics={"m": 0.5},
        best={"m": 0.75},
        config={"lr": 0.1},
        slots=(7, None),
        position="AfterStep",
        stop=None,
    )


def test_a_step_state_reads_as_the_state_it_stands_for():
    """Every attribute a hook reads is the State's: the step's own parts and the base's run-wide ones."""
    base = _base()
    s = stepping(base).moved(base.progress.advanced(1, 8), "AfterStep", (8, None), 8)
    expected = base.evolve(progress=base.progress.advanced(1, 8), slots=(8, None), slot=8)
    for name in ("progress", "rank", "world_size", "metrics", "best", "config", "slots", "slot", "position", "stop"):
        assert getattr(s, name) == getattr(expected, name), name
    assert (s.finished, s.is_main) == (expected.finished, expected.is_main) == (False, False)
    assert s == expected and expected == s and hash(s) == hash(expected)
    assert s.built() == expected and s.built().__class__ is State
    assert repr(s) == repr(expected) and str(s) == str(expected)


def test_with_slot_and_moved_give_step_states_over_the_same_base():
    """The fold's changers keep a StepState: no State is built for a slot or a step."""
    base = _base()
    s = stepping(base)
    assert s.base is base and stepping(s) is s
    other = s.with_slot(3)
    assert other.__class__ is StepState and other.base is base and other.slot == 3 and s.slot is None
    moved = s.moved(base.progress, "BeforeStep", (1, 2), None)
    assert moved.__class__ is StepState and moved.position == "BeforeStep" and moved.slots == (1, 2)


def test_evolve_gives_a_state_and_leaves_the_step_state_as_it_was():
    """``state.evolve`` is the one spelling for a change of a run-wide part, on a State and a StepState alike."""
    base = _base()
    s = stepping(base).with_slot(9)
    changed = s.evolve(best=s.best.set("m", 0.9))
    assert changed.__class__ is State and changed.best["m"] == 0.9 and changed.slot == 9
    assert s.best["m"] == 0.75 and base.evolve(best={"m": 0.9}).best["m"] == 0.9


def test_a_step_state_is_read_only():
    """No attribute can be set: hooks share the value, as they share a frozen State."""
    s = stepping(_base())
    for name in ("progress", "slots", "slot", "position", "rank", "metrics"):
        with pytest.raises(AttributeError):
            setattr(s, name, None)
    with pytest.raises(AttributeError):
        s.anything = 1


def test_a_step_state_pickles_and_copies_as_its_state():
    """Pickled or copied, it is the State it stands for: what a spawned process or a snapshot keeps."""
    s = stepping(_base()).with_slot(4)
    for copied in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s), copy.copy(s)):
        assert copied.__class__ is State and copied == s.built()


def test_built_is_the_state_itself_for_a_state():
    """``built`` hands a State back as it is, and builds one for a StepState."""
    base = _base()
    assert built(base) is base and built(stepping(base)) == base


def _evolving(state, event):
    return attrs.evolve(state, config=state.config.set("seen", True)), ()


def test_attrs_evolve_on_a_step_state_is_a_clear_error_naming_the_hook_and_the_fix():
    """The old spelling in a step's hook raises a TypeError that says to write state.evolve(...)."""
    hooks = chain(_evolving)
    state = attrs.evolve(initial_state(hooks.hooks, iters_per_epoch=2, max_epochs=1), position="BeforeEpoch")
    with pytest.raises(TypeError, match=r"_evolving.*attrs\.evolve\(state, \.\.\.\).*state\.evolve\(\.\.\.\)"):
        fold(hooks, state, ev.BeforeStep(1))
    after, _ = fold(hooks, state, ev.BeforeTrain())  # any other event hands the hook a State: the old spelling works
    assert after.config["seen"] is True


@pytest.mark.parametrize("event", [ev.BeforeTrain(), ev.BeforeStep(1)], ids=["on a State", "on a StepState"])
def test_an_unrelated_attrs_error_in_a_hook_is_not_reworded(event):
    """Only attrs refusing the step's state is explained; a hook's other attrs errors come out as they were, on a
    step's events too (where the hook holds a StepState)."""

    def wrong(state, event):
        attrs.evolve(object())
        return state, ()

    hooks = chain(wrong)
    state = initial_state(hooks.hooks, iters_per_epoch=2, max_epochs=1)
    if event.__class__ is ev.BeforeStep:
        state = state.evolve(position="BeforeEpoch")
    with pytest.raises(attrs.exceptions.NotAnAttrsClassError, match="object"):
        fold(hooks, state, event)


def _counting(monkeypatch, cls):
    """A list that grows by one on each ``cls(...)`` from now on."""
    made, init = [], cls.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counting)
    return made


def _slotted(state, event):
    return state.with_slot((state.slot or 0) + 1), ()


def test_a_step_folds_over_a_step_state_and_builds_no_state(monkeypatch):
    """BeforeStep and AfterStep of hooks that read the state or change their slot build no State at all."""
    hooks = chain(_slotted, lambda state, event: (state, ()))
    state = attrs.evolve(initial_state(hooks.hooks, iters_per_epoch=3, max_epochs=1), position="BeforeEpoch")
    made = _counting(monkeypatch, State)
    for step in (1, 2, 3):
        state, emitted = fold(hooks, state, ev.BeforeStep(step))
        state, emitted = fold(hooks, state, ev.AfterStep(step, {"loss": 1.0}, 4))
    assert made == [] and state.__class__ is StepState
    assert state.slots[0] == 6 and state.progress.global_step == 3 and state.progress.samples_seen == 12
    monkeypatch.undo()
    after, _ = fold(hooks, state, ev.AfterEpoch(0))  # any other event: a State
    assert after.__class__ is State and after.slots[0] == 7 and after.position == "AfterEpoch"


def test_a_step_states_progress_is_built_on_first_read_and_kept(monkeypatch):
    """Steps whose hooks never read ``progress`` build no Progress; the first read builds one, later reads reuse it."""
    hooks = chain(_slotted)
    state = attrs.evolve(initial_state(hooks.hooks, iters_per_epoch=5, max_epochs=1), position="BeforeEpoch")
    made = _counting(monkeypatch, Progress)
    for step in (1, 2, 3):
        state, _ = fold(hooks, state, ev.BeforeStep(step))
        state, _ = fold(hooks, state, ev.AfterStep(step, {}, 2))
    assert made == [] and global_step_of(state) == 3 and next_event(state) == ev.BeforeStep(4)
    assert state.progress is state.progress and len(made) == 1
    assert (state.progress.global_step, state.progress.iter_in_epoch, state.progress.samples_seen) == (3, 3, 6)


def test_an_afterstep_out_of_order_is_refused_on_a_step_state():
    """The order check of ``AfterStep`` holds without the progress built."""
    state = stepping(attrs.evolve(State(Progress(5, 1)), position="BeforeStep"))
    with pytest.raises(ValueError, match=r"AfterStep\(step=3\) out of order: global_step is 0"):
        state.stepped(3, 1)


@given(
    iters=st.integers(1, 5),
    done=st.integers(0, 5),
    steps=st.integers(0, 5),
    limit=st.one_of(st.none(), st.integers(1, 12)),
    position=st.sampled_from(["BeforeStep", "AfterStep"]),
    stop=st.one_of(st.none(), st.just("plateau")),
)
def test_a_step_states_next_event_is_its_states(iters, done, steps, limit, position, stop):
    """The schedule reads a StepState without its progress and answers as for the State it stands for."""
    done, steps = min(done, iters), min(steps, iters - min(done, iters))
    base = State(Progress(iters, 2, iter_in_epoch=done, global_step=done, step_limit=limit), stop=stop)
    state = stepping(base)
    for _ in range(steps):
        state = state.stepped(global_step_of(state) + 1, 1)
    state = state.at(position)
    assert next_event(state) == next_event(state.built())
    assert global_step_of(state) == state.built().progress.global_step


def _logging(state, event):
    return state, (Log(state.progress.global_step, "x", {}),)


def test_a_step_whose_hooks_emit_hands_its_effects_a_state():
    """Effects run against a State: ``process`` and ``start`` build one where a step's hooks emitted."""

    class Keep:
        def __init__(self):
            self.seen = []

        def check(self, state, event, emitted):
            pass

        def execute(self, state, entry):
            self.seen.append(state.__class__)
            return ()

    hooks = chain(_logging)
    state = attrs.evolve(initial_state(hooks.hooks, iters_per_epoch=2, max_epochs=1), position="BeforeEpoch")
    executor = Keep()
    after = process(hooks, state, ev.BeforeStep(1), executor)
    assert executor.seen == [State] and after.__class__ is State and after.position == "BeforeStep"
