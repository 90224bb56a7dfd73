"""Skipping quiet steps changes nothing: simulate and plan give the same results as walking every event."""

import functools
import importlib
import re
from typing import ClassVar
from unittest import mock

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pimm_fn import plan
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Log, Stop
from pimm_fn.hooks import save_every
from pimm_fn.testing import simulate
from pimm_fn.testing.strategies import hook_stacks, metric_streams, rank_local_inputs, schedules

plan_module = importlib.import_module("pimm_fn.core.plan")  # the module: pimm_fn.core.plan is also the function


@attrs.frozen
class CountBeforeSteps:
    """Called before every step: keeps a count in its slot (no hook may then be skipped)."""

    events: ClassVar[tuple] = (ev.BeforeStep,)

    def init(self):
        return 0

    def __call__(self, state, event):
        return state.with_slot(state.slot + 1), ()


@attrs.frozen
class LogOnCadence:
    """Called for AfterStep every ``every`` steps: logs the step and its outputs (rank 0 executes it)."""

    events: ClassVar[tuple] = (ev.AfterStep,)
    every: int = 1

    def __call__(self, state, event):
        return state, (Log(event.step, "cadence", {"n": float(len(event.outputs))}),)


@attrs.frozen
class StopAt:
    """Called for AfterStep every ``every`` steps: requests a stop at the first such step from ``at`` on."""

    events: ClassVar[tuple] = (ev.AfterStep,)
    at: int = 1
    every: int = 1

    def __call__(self, state, event):
        return state, ((Stop(event.step, "enough"),) if event.step >= self.at else ())


def same(a, b) -> bool:
    """Equal, or equal but for NaNs (a NaN loss summed twice is two NaN objects, never ==)."""
    return a == b or repr(a) == repr(b)


@st.composite
def stacks(draw):
    """A standard stack (hook_stacks) with some hooks left out, and now and then one of the hooks above."""
    stack = draw(hook_stacks(max_every=12))
    keep = draw(st.lists(st.booleans(), min_size=len(stack), max_size=len(stack)))
    stack = [hook for hook, kept in zip(stack, keep) if kept]
    extra = draw(st.sampled_from((None, "cadence", "before_step", "stop")))
    if extra == "cadence":
        stack.insert(draw(st.integers(0, len(stack))), LogOnCadence(draw(st.integers(1, 15))))
    elif extra == "before_step":
        stack.append(CountBeforeSteps())
    elif extra == "stop":
        stack.insert(draw(st.integers(0, len(stack))), StopAt(draw(st.integers(1, 60)), draw(st.integers(1, 15))))
    return stack


@settings(max_examples=60)
@given(
    stack=stacks(),
    schedule=schedules(max_world_size=3, max_iters_per_epoch=30, max_epochs=3, max_resumes=3),
    metrics=metric_streams(),
    local=st.none() | rank_local_inputs(),
)
def test_simulate_skipping_quiet_steps_equals_walking_every_event(stack, schedule, metrics, local):
    """Every rank's trace, final state and resume indices are the same with skip_quiet on and off."""
    kwargs = dict(metrics=metrics, local=local, resume_at=schedule.resume_at, **schedule.kwargs())
    try:
        slow = simulate(stack, skip_quiet=False, **kwargs)
    except ValueError as stopped:  # a stop ended the run before a resume point: the same either way
        with pytest.raises(ValueError, match=re.escape(str(stopped))):
            simulate(stack, **kwargs)
        return
    quick = simulate(stack, **kwargs)
    assert same(quick.traces, slow.traces)
    assert same(quick.states, slow.states)
    assert quick.resume_index == slow.resume_index


def plan_walking_every_event(*args, **kwargs):
    """``plan`` with run_schedule told not to skip."""
    walk = functools.partial(plan_module.run_schedule, skip_quiet=False)
    with mock.patch.object(plan_module, "run_schedule", walk):
        return plan(*args, **kwargs)


@settings(max_examples=40)
@given(stack=stacks(), iters=st.integers(1, 30), epochs=st.integers(1, 3), data=st.data())
def test_plan_skipping_quiet_steps_equals_walking_every_event(stack, iters, epochs, data):
    """plan gives the same entries with and without skipping, fresh or from a start step."""
    start = data.draw(st.integers(0, iters * epochs), label="start_step")
    metrics = {step: {"mIoU": (step * 7) % 5 / 4} for step in range(1, iters * epochs + 1, 2)}
    kwargs = dict(iters_per_epoch=iters, max_epochs=epochs, start_step=start, metrics=metrics)
    assert plan(stack, **kwargs) == plan_walking_every_event(stack, **kwargs)


def test_plan_skips_by_default():
    """plan crosses the quiet steps: a long sparse schedule is planned with few walked steps."""
    calls = []
    original = plan_module.skip_to

    def counting(state, step, **kwargs):
        calls.append(step)
        return original(state, step, **kwargs)

    with mock.patch.object(plan_module, "skip_to", counting):
        entries = plan([save_every(1000)], iters_per_epoch=10_000, max_epochs=2)
    assert [e.step for e in entries][:2] == [1000, 2000] and len(entries) == 20
    assert calls[:2] == [999, 1999] and len(calls) == 20


def test_simulate_resume_at_a_quiet_step_stops_exactly_there():
    """A resume point on a step no hook is called on still ends its segment at that step."""
    quick = simulate([save_every(50)], world_size=2, iters_per_epoch=100, max_epochs=2, resume_at=(37, 120))
    slow = simulate(
        [save_every(50)], world_size=2, iters_per_epoch=100, max_epochs=2, resume_at=(37, 120), skip_quiet=False
    )
    assert quick.traces == slow.traces and quick.states == slow.states and quick.resume_index == slow.resume_index
    assert quick.resume_index[0] == (0, 2)  # no save before 37; the saves of 50 and 100 before 120


def test_simulate_refuses_a_non_bool_skip_quiet():
    """skip_quiet is a switch: anything but a bool is refused, naming it."""
    with pytest.raises(TypeError, match="'skip_quiet' must be a bool"):
        simulate([save_every(2)], world_size=1, iters_per_epoch=2, max_epochs=1, skip_quiet="no")
