"""Properties of the built-in hooks and the standard stacks, proved by simulation under hypothesis."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from pimm_fn import plan
from pimm_fn.core.effects import SaveCheckpoint, WriteBest
from pimm_fn.hooks import best_on, early_stop, evaluate_every, log_every, save_every
from pimm_fn.testing import assert_collective_agreement, assert_resume_continuity, simulate
from pimm_fn.testing.strategies import (
    STANDARD_ORDERS,
    hook_stacks,
    metric_streams,
    miou,
    rank_local_inputs,
    schedules,
)

SMALL = settings(max_examples=150)


def single_hooks():
    """Each built-in hook on its own (evaluators paired with best_on where it needs one)."""
    every = st.integers(1, 6)
    evaluators = st.builds(evaluate_every, st.integers(0, 6), st.just(miou), broadcast=st.booleans())
    return st.one_of(
        st.builds(save_every, every, snapshots=st.booleans()).map(lambda hook: [hook]),
        evaluators.map(lambda hook: [hook]),
        st.tuples(evaluators, st.builds(best_on, st.just("mIoU"), mode=st.sampled_from(("max", "min")))).map(list),
        st.builds(log_every, every).map(lambda hook: [hook]),
    )


def any_stack():
    return st.one_of(single_hooks(), hook_stacks())


@SMALL
@given(stack=any_stack(), schedule=schedules(), metrics=metric_streams(), local=rank_local_inputs())
def test_collective_effects_agree_under_rank_local_inputs(stack, schedule, metrics, local):
    """Every built-in hook and standard stack emits identical collective effects on every rank."""
    result = simulate(stack, metrics=metrics, local=local, resume_at=schedule.resume_at, **schedule.kwargs())
    assert_collective_agreement(result)


@settings(max_examples=80)
@given(
    stack=any_stack(),
    schedule=schedules(max_world_size=8, max_resumes=0),
    metrics=metric_streams(),
    local=rank_local_inputs(),
)
def test_resume_continues_exactly_at_every_step(stack, schedule, metrics, local):
    """Resumed at any step, every rank repeats the uninterrupted trace and ends in the same state."""
    assert_resume_continuity(
        stack, resume_at=range(1, schedule.max_steps + 1), metrics=metrics, local=local, **schedule.kwargs()
    )


@settings(max_examples=80)
@given(
    order=st.permutations(("evaluate", "save", "best", "stop", "log")),
    every=st.integers(1, 4),
    save_n=st.integers(1, 4),
    patience=st.integers(1, 3),
    schedule=schedules(max_world_size=2, max_resumes=0),
    metrics=metric_streams(),
)
def test_a_stack_stopping_early_resumes_exactly_at_every_step_whatever_its_order(
    order, every, save_n, patience, schedule, metrics
):
    """An early stop, its evaluator, a saver, best_on and log_every in any order: every checkpoint resumes exactly.

    Where the saver stands first, its save at the stopping step still records the stop.
    """
    parts = {
        "evaluate": evaluate_every(every, miou),
        "save": save_every(save_n),
        "best": best_on("mIoU"),
        "stop": early_stop("mIoU", patience=patience),
        "log": log_every(every),
    }
    stack = [parts[name] for name in order]
    assert_resume_continuity(stack, resume_at=range(1, schedule.max_steps + 1), metrics=metrics, **schedule.kwargs())


@SMALL
@given(n=st.integers(1, 8), schedule=schedules(max_iters_per_epoch=8, max_resumes=0))
def test_save_every_saves_exactly_on_cadence_deferring_epoch_ends_with_one_final_save(n, schedule):
    """Saves at every multiple of n (deferred to AfterEpoch at an epoch's end), then the last step exactly once."""
    result = simulate([save_every(n)], **schedule.kwargs())
    last = schedule.max_steps
    for trace in result.traces:
        saves = [(e.step, e.during, e.effect.final) for e in trace]
        expected = [
            (k, "AfterEpoch" if k % schedule.iters_per_epoch == 0 else "AfterStep", False)
            for k in range(n, last + 1, n)
        ]
        if last % n:
            expected.append((last, "AfterTrain", True))
        assert saves == expected
        assert [s for s, _, _ in saves].count(last) == 1
        assert sum(final for _, _, final in saves) <= 1


@SMALL
@given(
    schedule=schedules(max_resumes=0),
    metrics=metric_streams(ranks=("all", "main")),
    mode=st.sampled_from(("max", "min")),
    every=st.integers(1, 4),
)
def test_best_improves_strictly_and_nan_never_improves(schedule, metrics, mode, every):
    """WriteBest values are strictly monotone, never NaN, and exactly the running best of what was published."""
    result = simulate([evaluate_every(every, miou), best_on("mIoU", mode=mode)], metrics=metrics, **schedule.kwargs())
    better = (lambda a, b: a > b) if mode == "max" else (lambda a, b: a < b)
    expected, best = [], None
    for step in range(every, schedule.max_steps + 1, every):
        value = (metrics(step, 0) or {}).get("mIoU")
        if value is not None and not math.isnan(value) and (best is None or better(value, best)):
            best = value
            expected.append(WriteBest("mIoU", value, step))
    assert list(result.effects(0, WriteBest)) == expected
    for state in result.states:
        assert state.best.get("mIoU") == best


@SMALL
@given(stack=any_stack(), schedule=schedules(max_resumes=0), metrics=metric_streams())
def test_plan_equals_rank_0s_simulated_trace(stack, schedule, metrics):
    """plan() without outputs is exactly what rank 0 of a simulated job without local outputs executes."""
    result = simulate(stack, metrics=metrics, **schedule.kwargs())
    planned = plan(
        stack, iters_per_epoch=schedule.iters_per_epoch, max_epochs=schedule.max_epochs, metrics=metrics, outputs=()
    )
    assert tuple(e.to_trace_entry() for e in result.traces[0]) == planned


@SMALL
@given(stack=any_stack(), schedule=schedules(), metrics=metric_streams(), local=rank_local_inputs())
def test_simulation_is_deterministic(stack, schedule, metrics, local):
    """The same inputs give the same traces and states (NaN compared by repr)."""
    kwargs = dict(metrics=metrics, local=local, resume_at=schedule.resume_at, **schedule.kwargs())
    assert repr(simulate(stack, **kwargs)) == repr(simulate(stack, **kwargs))


def test_standard_orders_are_all_twenty_four_the_canonical_one_first():
    """No order rule: a save closes its event, so every order of the four hooks records the same checkpoints."""
    assert len(STANDARD_ORDERS) == 24 and STANDARD_ORDERS[0] == ("evaluate", "save", "best", "log")


@SMALL
@given(stack=hook_stacks(), schedule=schedules(max_resumes=0), metrics=metric_streams())
def test_a_save_at_an_evaluation_step_records_the_evaluation(stack, schedule, metrics):
    """In every order a save at an evaluation step executes after that evaluation's best update."""
    result = simulate(stack, metrics=metrics, **schedule.kwargs())
    trace = result.traces[0]
    for i, entry in enumerate(trace):
        if isinstance(entry.effect, SaveCheckpoint):
            later_best = [
                e
                for e in trace[i:]
                if isinstance(e.effect, WriteBest) and e.step == entry.step and e.during == entry.during
            ]
            assert not later_best, f"{entry} precedes a best update of the same moment"
