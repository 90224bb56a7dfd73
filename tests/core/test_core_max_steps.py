"""A step budget (max_steps): where training ends, in plan, simulate and the pure lifecycle."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pimm_fn import plan
from pimm_fn.core import codec
from pimm_fn.core import events as ev
from pimm_fn.core.budget import budget_lines, check_budget
from pimm_fn.core.effects import Evaluate, SaveCheckpoint
from pimm_fn.core.plan import initial_state
from pimm_fn.core.schedule import advance, next_event, resume_from
from attrs import evolve as replace

from pimm_fn.core.state import Progress, State
from pimm_fn.hooks import best_on, evaluate_every, log_every, save_every
from pimm_fn.testing import assert_collective_agreement, assert_resume_continuity, simulate
from pimm_fn.testing.strategies import miou


def walk(state):
    """Every lifecycle event from ``state`` to the end, and the final state."""
    events = []
    while (event := next_event(state)) is not None:
        events.append(event)
        state = advance(state, event)
    return events, state


def fresh(**budget):
    return initial_state((), iters_per_epoch=4, **budget)


def steps(events):
    return [e.step for e in events if isinstance(e, ev.AfterStep)]


def kinds(trace):
    return [(e.step, type(e.event).__name__, type(e.effect).__name__) for e in trace]


def test_a_step_budget_mid_epoch_closes_that_epoch_then_ends_training():
    """max_steps=10 with 4 steps per epoch: steps 1..10, epoch 2 cut after step 10, its AfterEpoch, AfterTrain."""
    events, final = walk(fresh(max_steps=10))
    assert steps(events) == list(range(1, 11))
    assert events[-4:] == [ev.BeforeStep(10), ev.AfterStep(10), ev.AfterEpoch(2), ev.AfterTrain()]
    assert [e.epoch for e in events if isinstance(e, ev.BeforeEpoch)] == [0, 1, 2]
    p = final.progress
    assert (p.global_step, p.epoch, p.iter_in_epoch, p.max_epochs, p.steps_left) == (10, 2, 2, 3, 0)


def test_a_step_budget_on_an_epoch_boundary_plans_as_that_many_epochs():
    """max_steps = k * iters_per_epoch predicts exactly what max_epochs = k does."""
    hooks = [evaluate_every(0, miou), save_every(3), best_on("mIoU"), log_every(2)]
    metrics = lambda step, rank: {"mIoU": step % 5}
    assert plan(hooks, iters_per_epoch=4, max_steps=12, metrics=metrics) == plan(
        hooks, iters_per_epoch=4, max_epochs=3, metrics=metrics
    )
    assert walk(fresh(max_steps=8))[0] == walk(fresh(max_epochs=2))[0]


def test_a_step_budget_smaller_than_an_epoch_cuts_the_first_epoch():
    """max_steps=3 with 10 steps per epoch: one epoch of three steps, then the final save at step 3."""
    trace = plan([save_every(2)], iters_per_epoch=10, max_steps=3)
    assert kinds(trace) == [(2, "AfterStep", "SaveCheckpoint"), (3, "AfterTrain", "SaveCheckpoint")]
    events, _ = walk(initial_state((), iters_per_epoch=10, max_steps=3))
    assert events[-2:] == [ev.AfterEpoch(0), ev.AfterTrain()]


def test_a_save_on_the_last_budgeted_step_is_deferred_past_the_cut_epochs_evaluation():
    """save_every(5), max_steps=10, 4 per epoch: step 10 ends the cut epoch; its save follows that epoch's evaluation."""
    trace = plan([evaluate_every(0, miou), save_every(5)], iters_per_epoch=4, max_steps=10)
    assert kinds(trace)[-2:] == [(10, "AfterEpoch", "Evaluate"), (10, "AfterEpoch", "SaveCheckpoint")]
    assert trace[-1].effect.deferred and not trace[-1].effect.final
    assert [e.effect.step for e in trace if isinstance(e.effect, SaveCheckpoint)] == [5, 10]


def test_log_windows_close_at_the_budget_as_at_an_epoch_end():
    """log_every(4) logs on its cadence and at each epoch end, the cut one included."""
    trace = plan([log_every(4)], iters_per_epoch=6, max_steps=9)
    assert [(e.step, type(e.event).__name__) for e in trace] == [
        (4, "AfterStep"),
        (6, "AfterEpoch"),
        (8, "AfterStep"),
        (9, "AfterEpoch"),
    ]


@settings(max_examples=120, deadline=None)
@given(
    ipe=st.integers(1, 6),
    budget=st.integers(1, 30),
    save=st.integers(1, 7),
    evaluate=st.integers(0, 6),
    log=st.integers(1, 5),
    world_size=st.integers(1, 3),
    data=st.data(),
)
def test_simulate_agrees_with_plan_and_the_last_save_is_at_the_budget(
    ipe, budget, save, evaluate, log, world_size, data
):
    """For any schedule and cadences, simulate(max_steps=N) is plan's trace on every rank and ends with a save at N."""
    hooks = [evaluate_every(evaluate, miou), save_every(save), best_on("mIoU"), log_every(log)]
    metrics = lambda step, rank: {"mIoU": (step * 7) % 5}
    planned = plan(hooks, iters_per_epoch=ipe, max_steps=budget, metrics=metrics, outputs=())
    result = simulate(hooks, world_size=world_size, iters_per_epoch=ipe, max_steps=budget, metrics=metrics)
    assert tuple(e.to_trace_entry() for e in result.traces[0]) == planned
    saves = [e.effect.step for e in planned if isinstance(e.effect, SaveCheckpoint)]
    assert saves[-1] == budget and saves == sorted(set(saves))
    assert all(s.progress.global_step == budget and s.finished for s in result.states)
    walked = simulate(hooks, world_size=1, iters_per_epoch=ipe, max_steps=budget, metrics=metrics, skip_quiet=False)
    assert walked.traces[0] == result.traces[0]
    assert_collective_agreement(result)
    resume_at = data.draw(st.integers(1, budget), label="resume_at")
    assert_resume_continuity(
        hooks, resume_at=resume_at, world_size=world_size, iters_per_epoch=ipe, max_steps=budget, metrics=metrics
    )


@pytest.mark.parametrize("call", [plan, simulate])
@pytest.mark.parametrize(
    "budget, error, message",
    [
        (dict(max_epochs=2, max_steps=5), TypeError, "exactly one of max_epochs= .* and max_steps= .*got both"),
        (dict(), TypeError, "exactly one of max_epochs= .* and max_steps= .*got neither"),
        (dict(max_steps=0), ValueError, r"'max_steps' must be an int >= 1 \(got 0\)"),
        (dict(max_steps=2.5), ValueError, r"'max_steps' must be an int >= 1 \(got 2.5\)"),
    ],
)
def test_plan_and_simulate_need_exactly_one_valid_budget(call, budget, error, message):
    """Both budgets, neither, or max_steps < 1 fail at once, naming the arguments."""
    extra = {"world_size": 1} if call is simulate else {}
    with pytest.raises(error, match=message):
        call([save_every(2)], iters_per_epoch=4, **budget, **extra)


def test_check_budget_names_the_caller():
    """The error says who was called: loop, plan or simulate."""
    with pytest.raises(TypeError, match="^loop: pass exactly one"):
        check_budget(None, None, caller="loop")


def test_a_progress_saved_before_step_budgets_existed_decodes_without_one():
    """A checkpoint's Progress without step_limit decodes as an epoch budget."""
    data = codec.encode(Progress(4, 3, epoch=1, iter_in_epoch=2, global_step=6))
    del data["fields"]["step_limit"]
    old = codec.decode(data)
    assert old.step_limit is None and old.max_steps == 12 and old.steps_left == 6
    assert codec.loads(codec.dumps(Progress(4, 3, step_limit=10))).step_limit == 10


def _finished(budget=10):
    return walk(fresh(max_steps=budget))[1]


def test_resuming_with_the_same_step_budget_changes_nothing():
    """The checkpoint's own budget: the same state, nothing left to train."""
    final = _finished()
    assert resume_from(final, max_steps=10) is final and walk(final)[0] == []


def test_a_larger_step_budget_extends_a_finished_run_from_the_next_epoch():
    """max_steps 10 -> 15: the cut epoch 2 stays closed, epoch 3 trains steps 11..14, epoch 4 step 15."""
    extended = resume_from(_finished(), max_steps=15)
    assert extended.position == "AfterEpoch" and extended.progress.max_epochs == 5
    events, final = walk(extended)
    assert steps(events) == list(range(11, 16))
    assert [e.epoch for e in events if isinstance(e, ev.BeforeEpoch)] == [3, 4]
    assert final.progress.global_step == 15 and final.finished
    assert budget_lines(_finished().progress, extended.progress, max_steps=15) == (
        "max_steps 10 -> max_steps 15: training goes on to step 15",
    )


def test_a_step_budget_already_passed_ends_the_run_at_once_where_it_is():
    """A mid-epoch checkpoint at step 7 resumed with max_steps=5 closes its epoch and ends, training nothing."""
    state = walk_to(fresh(max_steps=10), 7)
    ended = resume_from(state, max_steps=5)
    assert ended.progress.step_limit == 7 and ended.progress.steps_left == 0
    assert walk(ended)[0] == [ev.AfterEpoch(1), ev.AfterTrain()]
    (line,) = budget_lines(state.progress, ended.progress, max_steps=5)
    assert line == "max_steps=5 was already reached: this checkpoint is at step 7, so training ends at once"


def walk_to(state, step):
    """``state`` after ``AfterStep(step)``."""
    while not (state.position == "AfterStep" and state.progress.global_step == step):
        state = advance(state, next_event(state))
    return state


def test_an_epoch_budget_and_a_step_budget_can_replace_each_other_on_resume():
    """max_steps -> max_epochs drops the step limit; max_epochs -> max_steps sets it; both are said."""
    state = walk_to(fresh(max_steps=10), 6)
    by_epochs = resume_from(state, max_epochs=4)
    assert by_epochs.progress.step_limit is None and steps(walk(by_epochs)[0])[-1] == 16
    by_steps = resume_from(walk_to(fresh(max_epochs=2), 3), max_steps=9)
    assert steps(walk(by_steps)[0])[-1] == 9
    assert budget_lines(state.progress, by_epochs.progress) == (
        "max_steps 10 -> max_epochs 4: training goes on for 4 epoch(s) in all",
    )


@pytest.mark.parametrize("new_ipe", [1, 3, 5, 7])
def test_a_step_budget_ends_at_its_step_when_the_epoch_length_changes(new_ipe):
    """Resumed mid-epoch on another world size (another epoch length), training still ends at global step N."""
    state = walk_to(fresh(max_steps=21), 6)
    p = state.progress
    # What a resume on another world size keeps: global_step and samples; the epoch gets the new length.
    moved = replace(state, progress=replace(p, iters_per_epoch=new_ipe, iter_in_epoch=min(p.iter_in_epoch, new_ipe)))
    resumed = resume_from(moved, max_steps=21)
    events, final = walk(resumed)
    assert steps(events)[-1] == 21 and final.progress.global_step == 21 and final.finished
    assert final.progress.epoch == resumed.progress.max_epochs - 1
    planned = plan([save_every(4)], iters_per_epoch=new_ipe, max_steps=21, start=moved.progress)
    assert planned[-1].step == 21


def test_a_step_budget_travels_with_a_simulated_resume():
    """Resume points are bounded by max_steps, and a resumed simulation ends at the budget."""
    result = simulate([save_every(3)], world_size=2, iters_per_epoch=4, max_steps=10, resume_at=(3, 10))
    assert [e.step for e in result.traces[0] if isinstance(e.effect, SaveCheckpoint)] == [3, 6, 9, 10]
    with pytest.raises(ValueError, match=r"'resume_at' must hold steps in \[1, 10\]"):
        simulate([save_every(3)], world_size=1, iters_per_epoch=4, max_steps=10, resume_at=11)


def test_an_evaluation_on_the_budgeted_step_precedes_the_final_save():
    """evaluate_every(3) and max_steps=9 mid-epoch: step 9 evaluates, and the save of step 9 comes last."""
    trace = plan([evaluate_every(3, miou), save_every(100)], iters_per_epoch=4, max_steps=9)
    assert [type(e.effect) for e in trace][-2:] == [Evaluate, SaveCheckpoint]
    assert trace[-1].step == 9 and trace[-1].effect.final
    assert State(Progress(4, 3, step_limit=9, global_step=9, epoch=2, iter_in_epoch=1)).progress.at_epoch_end
