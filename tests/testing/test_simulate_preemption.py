"""Preemption and time in the simulator: every rank stops at one step, and the resumed run continues the trace.

``simulate(preempt={rank: step})`` sends a signal to any subset of ranks at
any steps; ``clock``/``max_time`` model rank 0's clock and the time budget.
The rules are the runtime's (``pimm_fn.core.preemption``), applied by each
rank to what it can see, so agreement is a property to prove, not a given.
"""

from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.core import events as ev
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.core.preemption import stop_step
from pimm_fn.testing import simulate
from pimm_fn.testing.strategies import StepClock, preemption_requests, step_clocks
from pimm_fn.testing.strategies import hook_stacks, metric_streams, schedules

_RESUMED = ev.BeforeTrain(resumed=True)


def _continued(trace) -> list:
    """A stitched trace without the entries of the resumes' own BeforeTrain(resumed=True)."""
    return [e.to_trace_entry() for e in trace if e.event != _RESUMED]


@st.composite
def preempted_runs(draw):
    schedule = draw(schedules(max_world_size=6, max_resumes=0))
    requests = draw(preemption_requests(world_size=schedule.world_size, max_steps=schedule.max_steps))
    every = draw(st.sampled_from((1, 2, 3, None)))
    clock = draw(step_clocks())
    return schedule, requests, every, clock


@settings(max_examples=120)
@given(run=preempted_runs(), stack=hook_stacks(), metrics=metric_streams(ranks=("all", "main")))
def test_every_rank_saves_the_same_step_and_the_resume_continues_the_trace(run, stack, metrics):
    """Signals on any ranks at any steps: one agreed stop on every rank, and the stitched run equals the plain one."""
    schedule, requests, every, clock = run
    kwargs = dict(metrics=metrics, **schedule.kwargs())
    plain = simulate(stack, **kwargs)
    stopped = simulate(stack, preempt=requests, clock=clock, check_every=every, **kwargs)
    assert len(set(stopped.preempted)) == 1  # every rank: the same stops, at the same steps, for the same reasons
    stops = stopped.preempted[0]
    if requests and every is not None:
        expected = stop_step(requests, world_size=schedule.world_size, every=every)
        assert [s for s, _ in stops] == ([expected] if expected < schedule.max_steps else [])
    for step, reason in stops:
        assert reason == "SIGTERM" and min(requests.values()) <= step < schedule.max_steps
    for rank in range(schedule.world_size):
        assert _continued(stopped.traces[rank]) == _continued(plain.traces[rank])
        assert stopped.states[rank] == plain.states[rank]


@settings(max_examples=80)
@given(
    schedule=schedules(max_world_size=4, max_resumes=0),
    seconds=st.floats(0.1, 5.0),
    limit=st.floats(1.0, 60.0),
    margin=st.floats(0.0, 10.0),
    every=st.sampled_from((1, None)),
)
def test_max_time_stops_every_rank_before_the_limit_less_the_margin(schedule, seconds, limit, margin, every):
    """Steps of constant length: each process stops at a boundary before max_time - margin, then resumes to the end.

    (Where two steps fit in the budget: the earliest stop of several ranks is after the second step.)
    """
    assume(2 * seconds < limit - margin)
    clock = StepClock((seconds,))
    result = simulate(
        [pf.save_every(3)], clock=clock, max_time=limit, margin=margin, check_every=every, **schedule.kwargs()
    )
    assert len(set(result.preempted)) == 1
    begun = 0
    for step, reason in result.preempted[0]:
        assert reason == "max_time"
        if every == 1:
            assert clock(step) - clock(begun) < limit - margin + 1e-9  # the clock's sums round in the last bit
        begun = step
    assert result.states[0].finished and result.states[0].progress.global_step == schedule.max_steps


def test_save_every_minutes_saves_on_the_clock_it_is_given():
    """save_every(minutes=1) at 25 s a step: saves at steps 3, 6, 9 (75 s apart), then the final save."""
    trace = pf.plan([pf.save_every(minutes=1)], iters_per_epoch=5, max_epochs=2, clock=StepClock((25.0,)))
    assert [(e.step, type(e.event).__name__) for e in trace] == [
        (3, "Elapsed"),
        (6, "Elapsed"),
        (9, "Elapsed"),
        (10, "AfterTrain"),
    ]
    assert all(isinstance(e.effect, SaveCheckpoint) for e in trace)


def test_plan_ends_where_max_time_would_stop():
    """plan(clock=..., max_time=, margin=): 10 s a step, 100 s less 25: the run stops at step 6 (70 s, next 80 > 75)."""
    trace = pf.plan(
        [pf.save_every(2)], iters_per_epoch=5, max_epochs=4, clock=StepClock((10.0,)), max_time=100, margin=25
    )
    assert [e.step for e in trace] == [2, 4, 6]


def test_a_time_cadence_restarts_with_each_resumed_process():
    """After a preemption at step 4 the clock starts again: the next time save comes a full minute later."""
    result = simulate(
        [pf.save_every(minutes=1)],
        world_size=2,
        iters_per_epoch=10,
        max_epochs=1,
        preempt={1: 3},
        clock=StepClock((20.0,)),
        check_every=1,
    )
    assert result.preempted == (((4, "SIGTERM"),), ((4, "SIGTERM"),))
    assert [e.step for e in result.traces[0] if isinstance(e.event, ev.Elapsed)] == [3, 7]


def test_only_hooks_that_name_elapsed_get_it_even_inside_a_chain():
    """Elapsed is opt-in: a hook with no ``events`` never sees it; a chain still passes it to the child that names it."""
    seen = []

    def every_event(state, event):
        seen.append(type(event).__name__)
        return state, ()

    trace = pf.plan(
        [pf.chain(every_event, pf.save_every(minutes=1))], iters_per_epoch=5, max_epochs=2, clock=StepClock((25.0,))
    )
    assert "Elapsed" not in seen and "AfterStep" in seen
    assert [(e.step, type(e.event).__name__) for e in trace] == [
        (3, "Elapsed"),
        (6, "Elapsed"),
        (9, "Elapsed"),
        (10, "AfterTrain"),
    ]
