"""Skipping quiet steps: skip_to, and run_schedule's jumps over steps on which no hook is called."""

from typing import ClassVar

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import RecordingExecutor, initial_state, run_schedule
from pimm_fn.core.schedule import advance, last_quiet_step, next_event, skip_to
from pimm_fn.core.state import Progress, State
from pimm_fn.hooks import log_every, save_every


def points_before_a_step(state):
    """Every state of the walk from ``state`` whose next event is a ``BeforeStep``."""
    found = []
    event = next_event(state)
    while event is not None:
        if isinstance(event, ev.BeforeStep):
            found.append(state)
        state = advance(state, event)
        event = next_event(state)
    return found


def step_through(state, step, batch_size=0):
    """``state`` walked event by event through ``BeforeStep``/``AfterStep`` up to ``AfterStep(step)``."""
    while state.progress.global_step < step:
        s = state.progress.global_step + 1
        state = advance(advance(state, ev.BeforeStep(s)), ev.AfterStep(s, batch_size=batch_size))
    return state


@settings(max_examples=60)
@given(iters=st.integers(1, 12), epochs=st.integers(1, 3), data=st.data())
def test_skip_to_equals_walking_the_steps_event_by_event(iters, epochs, data):
    """From any point before a step, skip_to(state, k) is the state walking to AfterStep(k) leaves."""
    start = data.draw(st.sampled_from(points_before_a_step(State(Progress(iters, epochs), slots=("kept",)))))
    p = start.progress
    step = data.draw(st.integers(p.global_step, p.global_step + p.iters_per_epoch - p.iter_in_epoch))
    batch_size = data.draw(st.integers(0, 4))
    assert skip_to(start, step, batch_size=batch_size) == step_through(start, step, batch_size)


def test_skip_to_the_current_step_changes_nothing():
    """A jump of no steps returns the state itself."""
    state = advance(State(Progress(5, 2)), ev.BeforeEpoch(0))
    assert skip_to(state, 0) is state


def test_skip_to_keeps_the_slots_and_moves_the_position():
    """Nothing is called: the slots stay as they were; the position is AfterStep."""
    state = advance(State(Progress(5, 2), slots=(1, "two")), ev.BeforeEpoch(0))
    after = skip_to(state, 4)
    assert after.slots == (1, "two") and after.position == "AfterStep" and after.slot is None
    assert after.progress == Progress(5, 2, epoch=0, iter_in_epoch=4, global_step=4)


@pytest.mark.parametrize("position", [None, "ModifyConfig", "BeforeTrain", "BeforeStep", "AfterEpoch", "AfterTrain"])
def test_skip_to_refuses_a_state_whose_next_event_is_not_a_before_step(position):
    """Only a state about to start a step can jump: elsewhere the next event is not a step's."""
    with pytest.raises(ValueError, match="next event must be a BeforeStep"):
        skip_to(State(Progress(5, 2), position=position), 1)


def test_skip_to_refuses_a_state_at_an_epochs_end():
    """After an epoch's last step comes AfterEpoch, never another step."""
    end = State(Progress(5, 2, iter_in_epoch=5, global_step=5), position="AfterStep")
    with pytest.raises(ValueError, match="next event must be a BeforeStep"):
        skip_to(end, 6)


@pytest.mark.parametrize("step", [2, 11, 100])
def test_skip_to_refuses_a_step_outside_the_epoch(step):
    """The target must lie between the current step and the epoch's last step, naming the range."""
    state = State(Progress(5, 3, epoch=1, iter_in_epoch=2, global_step=7), position="AfterStep")
    with pytest.raises(ValueError, match=r"'step' must be in \[7, 10\]"):
        skip_to(state, step)


@attrs.define
class CountingExecutor(RecordingExecutor):
    """Records like plan and counts the events handed to ``check`` (one per processed event)."""

    checked: int = 0

    def check(self, state, event, emitted) -> None:
        self.checked += 1


def run(hooks, *, iters, epochs, outputs=None, **kwargs):
    hooks = chain(*hooks)
    executor = CountingExecutor(lambda step, rank: None)
    state = initial_state(hooks.hooks, iters_per_epoch=iters, max_epochs=epochs)
    return run_schedule(hooks, state, executor, outputs, **kwargs), executor


def test_run_schedule_crosses_quiet_steps_without_processing_their_events():
    """save_every(50) over 2 x 100 steps: only the saving steps and the epoch ends are walked, with the same result."""
    quick, quick_ex = run([save_every(50)], iters=100, epochs=2)
    slow, slow_ex = run([save_every(50)], iters=100, epochs=2, skip_quiet=False)
    assert quick == slow and quick_ex.trace == slow_ex.trace
    assert slow_ex.checked == 2 + 2 * (2 + 2 * 100) + 1
    # per epoch: BeforeEpoch, steps 50 and 100 walked (AfterStep only: no hook wants BeforeStep), AfterEpoch
    assert quick_ex.checked == 2 + 2 * (2 + 2) + 1


@attrs.frozen
class CountBeforeSteps:
    """A hook called before every step: its slot counts them."""

    events: ClassVar[tuple] = (ev.BeforeStep,)

    def init(self):
        return 0

    def __call__(self, state, event):
        return state.with_slot(state.slot + 1), ()


def test_run_schedule_walks_every_step_when_a_hook_wants_before_step():
    """A hook subscribed to BeforeStep is called for every step, skipping or not."""
    final, _ = run([CountBeforeSteps(), save_every(50)], iters=100, epochs=2)
    assert final.slots[0] == 200 and final.finished


def test_run_schedule_jumps_over_quiet_steps_handing_their_outputs_to_the_accumulating_hooks():
    """log_every sums every step's outputs: each is asked for, and the jumps end in the walk's states."""
    asked = []
    outputs = lambda step: asked.append(step) or {"loss": 1.0}  # noqa: E731
    quick, quick_ex = run([log_every(30)], iters=100, epochs=1, outputs=outputs)
    assert asked == list(range(1, 101))
    slow, slow_ex = run([log_every(30)], iters=100, epochs=1, outputs=lambda step: {"loss": 1.0}, skip_quiet=False)
    assert quick == slow and quick_ex.trace == slow_ex.trace
    # Only the steps log_every is called for (30, 60, 90) and the epoch's last are processed.
    assert (quick_ex.checked, slow_ex.checked) == (3 + 4 + 2, 3 + 2 * 100 + 2)


def test_run_schedule_asks_outputs_only_for_walked_steps_when_nobody_accumulates():
    """With no accumulator the outputs of a quiet step reach nobody: they are not computed."""
    asked = []
    outputs = lambda step: asked.append(step) or {"loss": 1.0}  # noqa: E731
    run([save_every(40)], iters=100, epochs=1, outputs=outputs)
    assert asked == [40, 80, 100]


def at(step):
    return lambda state: state.progress.global_step == step and state.position == "AfterStep"


def test_run_schedule_with_stop_and_no_visit_walks_every_step():
    """A stop predicate the walk cannot see into is asked after every event, so it stops where it says."""
    final, executor = run([save_every(50)], iters=100, epochs=2, stop=at(37))
    assert final.progress.global_step == 37 and final.position == "AfterStep"
    assert executor.checked == 2 + 1 + 37  # every AfterStep processed; each BeforeStep only advanced


@pytest.mark.parametrize("step", [1, 37, 49, 50, 51, 100, 137])
def test_run_schedule_jumps_stop_short_of_visit(step):
    """With visit, the jump ends before that step, which is walked: stop sees exactly the stepping state."""
    quick, _ = run([save_every(50)], iters=100, epochs=2, stop=at(step), visit=step)
    slow, _ = run([save_every(50)], iters=100, epochs=2, stop=at(step), skip_quiet=False)
    assert quick == slow and quick.progress.global_step == step


def test_run_schedule_cadence_arithmetic_finds_each_firing_step():
    """Cadences 7 and 9: the walk lands on every multiple of either (and the epoch ends), as stepping does."""
    hooks = [save_every(7, snapshots=True), log_every(9)]
    quick, quick_ex = run(hooks, iters=40, epochs=3)
    slow, slow_ex = run(hooks, iters=40, epochs=3, skip_quiet=False)
    assert quick == slow and quick_ex.trace == slow_ex.trace
    fired = {s for s in range(1, 121) if s % 7 == 0 or s % 9 == 0} | {40, 80, 120}
    # ModifyConfig, BeforeTrain, per epoch BeforeEpoch and AfterEpoch, each firing step's AfterStep, AfterTrain
    assert quick_ex.checked == 2 + 3 * 2 + len(fired) + 1
    assert [e.step for e in quick_ex.trace if e.effect.__class__.__name__ == "SaveCheckpoint"][:3] == [7, 14, 21]


def test_run_schedule_skipping_is_the_default_and_can_be_turned_off():
    """skip_quiet defaults to True in run_schedule; False walks every event."""
    assert run_schedule.__kwdefaults__["skip_quiet"] is True
    _, executor = run([], iters=10, epochs=1, skip_quiet=False)
    assert executor.checked == 2 + 2 + 2 * 10 + 1


def test_run_schedule_with_no_hooks_jumps_to_each_epochs_last_step():
    """No hook at all: each epoch is BeforeEpoch, its last step and AfterEpoch."""
    final, executor = run([], iters=1000, epochs=3)
    assert final.finished and final.progress.global_step == 3000
    assert executor.checked == 2 + 3 * 3 + 1


@given(cadences=st.sets(st.integers(1, 6), max_size=3))
def test_fires_every_step_is_exactly_a_chain_with_no_quiet_step(cadences):
    """``fires_every_step`` (the loop's shortcut past ``last_quiet_step``) holds iff no step of a long epoch is quiet."""
    hooks = chain(*(save_every(c) for c in sorted(cadences)))
    never_quiet = all(
        last_quiet_step(hooks, Progress(100, 1, iter_in_epoch=step, global_step=step)) == step for step in range(40)
    )
    assert hooks.fires_every_step == never_quiet == (1 in cadences)
