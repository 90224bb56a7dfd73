"""The resumable pass: ``start``/``Pending.advance``/``finish`` is ``process``, and stopping anywhere loses nothing."""

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import initial_state
from pimm_fn.core.processing import Frame, Pending, finish, process, start
from test_core_fold import React, Scripted, Tag

ANSWERS = {"a.1": (ev.MetricsPublished({"m": 1.0}, "m1"),), "r.m1": (ev.MetricsPublished({"n": 2.0}, "m2"),)}


def hooks():
    return chain(Tag("a", ("1", "2")), React("r", ("m1", "m2")), React("s", ("m2",)), Tag("b", ("1",)))


def fresh(h):
    return initial_state(h.hooks, iters_per_epoch=2, max_epochs=1)


@attrs.define
class Failing(Scripted):
    """``Scripted``, raising instead of executing at the execute calls numbered in ``fail_at`` (from 1)."""

    fail_at: frozenset = frozenset()
    calls: int = 0

    def execute(self, state, entry):
        self.calls += 1
        if self.calls in self.fail_at:
            raise KeyboardInterrupt(f"at call {self.calls}")
        return super().execute(state, entry)


def test_start_then_finish_is_process():
    """start then finish executes the same effects, in the same order, to the same state as process."""
    h = hooks()
    whole, stepped = Scripted(ANSWERS), Scripted(ANSWERS)
    expected = process(h, fresh(h), ev.BeforeTrain(), whole)
    state, work = start(h, fresh(h), ev.BeforeTrain(), stepped)
    assert isinstance(work, Pending) and finish(h, work, stepped) == expected
    assert stepped.trace == whole.trace == ["a.1", "r.m1", "r.m2", "s.m2", "a.2", "b.1"]
    assert stepped.checked == whole.checked


def test_an_event_without_effects_leaves_no_work():
    """start returns None as the work when the event emitted nothing: nothing to keep."""
    h = chain(Tag("a"))
    state, work = start(h, fresh(h), ev.BeforeTrain(), Scripted({}))
    assert work is None and state.position == "BeforeTrain"


@settings(max_examples=50, deadline=None)
@given(fail_at=st.frozensets(st.integers(1, 12), max_size=4))
def test_work_stopped_by_any_failing_effect_continues_exactly(fail_at):
    """Advancing the last Pending again after effects raise executes each effect once, in order, to the same state."""
    h = hooks()
    expected_executor = Scripted(ANSWERS)
    expected = process(h, fresh(h), ev.BeforeTrain(), expected_executor)
    executor = Failing(ANSWERS, fail_at=fail_at)
    state, work = start(h, fresh(h), ev.BeforeTrain(), executor)
    failures = 0
    while not work.done:
        try:
            work = work.advance(h, executor)
        except KeyboardInterrupt:
            failures += 1  # ``work`` is still the value before the failed unit
    assert work.state == expected
    assert executor.trace == expected_executor.trace
    assert executor.checked == expected_executor.checked
    assert failures == len({n for n in fail_at if n <= executor.calls})


def test_a_failing_follow_up_fold_is_retried_from_the_same_pending():
    """A hook raising on a follow-up event leaves the Pending as it was: advancing again folds it again."""

    @attrs.frozen
    class Flaky:
        box: list
        events = (ev.MetricsPublished,)

        def __call__(self, state, event):
            if self.box:
                raise self.box.pop()
            return state, ()

    box = [RuntimeError("once")]
    h = chain(Tag("a", ("1", "2")), Flaky(box))
    executor = Scripted(ANSWERS)
    _, work = start(h, fresh(h), ev.BeforeTrain(), executor)
    work = work.advance(h, executor)  # executes a.1, whose follow-up is next
    assert work.next_effect is None and work.next_followup == ev.MetricsPublished({"m": 1.0}, "m1")
    assert work.upcoming is None
    with pytest.raises(RuntimeError, match="once"):
        work.advance(h, executor)
    assert finish(h, work, executor).metrics["m"] == 1.0
    assert executor.trace == ["a.1", "a.2"]


def test_pending_names_the_next_effect_with_its_step_and_hook():
    """next_effect is the TraceEntry the next advance executes."""
    h = hooks()
    _, work = start(h, fresh(h), ev.BeforeTrain(), Scripted({}))
    entry = work.next_effect
    assert (entry.step, entry.event, entry.effect.kind, entry.hook) == (0, ev.BeforeTrain(), "a.1", 0)
    assert work.upcoming is entry.effect  # the same effect, bare
    assert len(work.frames) == 1 and isinstance(work.frames[0], Frame)
