"""assert_collective_agreement and assert_resume_continuity: passes, and readable failures."""

import re

import pytest
from hypothesis import given, settings

from pimm_fn.core.effects import Log, SaveCheckpoint
from pimm_fn.core.events import AfterStep, BeforeTrain
from pimm_fn.hooks import best_on, early_stop, evaluate_every, log_every, save_every
from pimm_fn.testing import assert_collective_agreement, assert_resume_continuity, simulate
from pimm_fn.testing.strategies import metric_streams, miou, schedules

from _kit_hooks import SaveOnImprovement


class CountsOutsideItsSlot:
    """Logs its calls since training began, counted in an attribute, not its slot: a resume counts from zero again."""

    events = (BeforeTrain, AfterStep)

    def __init__(self):
        self.calls = 0

    def __call__(self, state, event):
        if isinstance(event, BeforeTrain):
            self.calls = 0
            return state, ()
        self.calls += 1
        return state, (Log(event.step, "calls", {"calls": self.calls}),)

    def __repr__(self):
        return "CountsOutsideItsSlot()"


def broken_stack():
    return [evaluate_every(1, miou, broadcast=False), SaveOnImprovement("mIoU")]


def test_agreement_holds_for_the_standard_stack_under_rank_local_inputs():
    """Rank-local losses and rank-0-only metrics do not change any collective effect."""
    stack = [evaluate_every(2, miou), save_every(3), best_on("mIoU"), log_every(1)]
    result = simulate(
        stack,
        world_size=4,
        iters_per_epoch=3,
        max_epochs=2,
        metrics=lambda s, r: {"mIoU": s % 4} if r == 0 else None,
        local=lambda s, r: {"loss": float(s * r)},
    )
    assert_collective_agreement(result)


def test_disagreement_report_names_step_event_hook_and_ranks():
    """The report gives the first diverging moment, the hook (index and repr) and what each rank wanted."""
    result = simulate(
        broken_stack(),
        world_size=4,
        iters_per_epoch=2,
        max_epochs=1,
        metrics=lambda step, rank: {"mIoU": 0.5} if rank == 0 else None,
    )
    with pytest.raises(AssertionError) as info:
        assert_collective_agreement(result)
    assert str(info.value) == (
        "ranks disagree on the collective effects at global step 1, during AfterStep; "
        "hook(s) involved: #1 save_on_improvement('mIoU')\n"
        "  rank 0 wanted: Evaluate(evaluator='miou', step=1, broadcast=False) from hook #0 "
        "evaluate_every(1, miou, broadcast=False) on AfterStep(step=1); "
        f"{SaveCheckpoint(1)!r} from hook #1 save_on_improvement('mIoU') "
        "on MetricsPublished(source='miou', step=1)\n"
        "  ranks 1, 2, 3 wanted: Evaluate(evaluator='miou', step=1, broadcast=False) from hook #0 "
        "evaluate_every(1, miou, broadcast=False) on AfterStep(step=1)\n"
        "A collective decision must depend only on rank-consistent state (progress, broadcast metrics); "
        "check the hook(s) above for rank-local inputs."
    )


def test_agreement_rejects_anything_but_a_simulation_result():
    """A clear TypeError instead of a confusing attribute error."""
    with pytest.raises(TypeError, match="takes what simulate"):
        assert_collective_agreement([])


def test_broken_hook_is_caught_by_hypothesis_with_a_small_readable_counterexample():
    """Under fuzzed schedules and metric streams the broken hook fails, shrunk to 2 ranks and one step."""

    @settings(max_examples=200, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(schedule=schedules(max_resumes=0), metrics=metric_streams())
    def test_save_on_improvement_agrees(schedule, metrics):
        assert_collective_agreement(simulate(broken_stack(), metrics=metrics, **schedule.kwargs()))

    with pytest.raises(AssertionError) as info:
        test_save_on_improvement_agrees()
    notes = " ".join(" ".join(getattr(info.value, "__notes__", [])).split())  # hypothesis wraps long lines
    assert "example: test_save_on_improvement_agrees(" in notes or "case: test_save_on_improvement_agrees(" in notes
    assert "schedule=Schedule(world_size=2, iters_per_epoch=1, max_epochs=1, resume_at=())" in notes
    assert "metrics=MetricStream(name='mIoU', values=(0.0,), ranks='main')" in notes
    report = str(info.value)
    assert report.startswith(
        "ranks disagree on the collective effects at global step 1, during AfterStep; "
        "hook(s) involved: #1 save_on_improvement('mIoU')"
    )
    assert "  rank 0 wanted: " in report and "SaveCheckpoint(step=1" in report
    assert len(report.splitlines()) == 4


def test_resume_continuity_holds_for_the_standard_stack_at_every_step():
    """Resuming at any step, as an int or an iterable, continues exactly."""
    stack = [evaluate_every(2, miou), save_every(3), best_on("mIoU"), log_every(2)]
    kwargs = dict(
        world_size=3,
        iters_per_epoch=4,
        max_epochs=2,
        metrics=lambda s, r: {"mIoU": (s * 5) % 7},
        local=lambda s, r: {"loss": float(s + r)},
    )
    assert_resume_continuity(stack, resume_at=5, **kwargs)
    assert_resume_continuity(stack, resume_at=range(1, 9), **kwargs)


def test_resume_report_shows_where_the_runs_part():
    """A hook counting outside its slot resumes with another count; the report shows both sides' first differing entry."""
    stack = [save_every(2), evaluate_every(2, miou), best_on("mIoU"), CountsOutsideItsSlot()]
    with pytest.raises(AssertionError) as info:
        assert_resume_continuity(
            stack,
            resume_at=2,
            world_size=1,
            iters_per_epoch=6,
            max_epochs=1,
            metrics={2: {"mIoU": 0.9}, 4: {"mIoU": 0.5}},
        )
    assert str(info.value) == (
        "rank 0, resumed from the checkpoint of step 2: the resumed run parts from the uninterrupted one "
        "at entry 1 after the resume\n"
        "  uninterrupted: step 3 during AfterStep: Log(step=3, kind='calls', values=FrozenMap({'calls': 3})) "
        "from hook #3 on AfterStep(step=3, outputs=FrozenMap({}), batch_size=0)\n"
        "  resumed:       step 3 during AfterStep: Log(step=3, kind='calls', values=FrozenMap({'calls': 1})) "
        "from hook #3 on AfterStep(step=3, outputs=FrozenMap({}), batch_size=0)"
    )


def test_resume_continuity_validates_its_steps():
    """Out-of-range steps and a duplicated resume_at are errors, not silent passes."""
    with pytest.raises(ValueError, match=r"in \[1, 4\]"):
        assert_resume_continuity([save_every(2)], resume_at=[5], world_size=1, iters_per_epoch=2, max_epochs=2)
    with pytest.raises(ValueError, match=r"in \[1, 4\]"):
        assert_resume_continuity([save_every(2)], resume_at=0, world_size=1, iters_per_epoch=2, max_epochs=2)


@pytest.mark.parametrize("resume_at", [b"\x03", [[2, 3]], [b"\x03"]])
def test_resume_continuity_refuses_a_step_that_is_no_int_even_when_it_holds_ints(resume_at):
    """Each point is one step: bytes or a list among them is refused, not read as the ints it holds."""
    with pytest.raises(ValueError, match=r"in \[1, 4\]"):
        assert_resume_continuity([save_every(2)], resume_at=resume_at, world_size=1, iters_per_epoch=2, max_epochs=2)


def test_the_tutorial_in_the_docs_shows_the_real_report():
    """docs/testing.md quotes the report the broken hook's shrunk counterexample really produces."""
    from pathlib import Path

    from pimm_fn.testing.strategies import MetricStream, Schedule

    docs = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
    schedule = Schedule(world_size=2, iters_per_epoch=1, max_epochs=1)
    result = simulate(broken_stack(), metrics=MetricStream("mIoU", (0.0,), "main"), **schedule.kwargs())
    with pytest.raises(AssertionError) as info:
        assert_collective_agreement(result)

    # The effect's optional fields may grow; the docs need only show today's.
    def same_fields(text):
        return re.sub(r"SaveCheckpoint\(step=1[^)]*\)", "SaveCheckpoint(step=1, ...)", text)

    text = same_fields(docs.read_text())
    assert same_fields(f"AssertionError: {info.value}") in text
    assert repr(schedule) in text


STOPS_AT_4 = dict(world_size=2, iters_per_epoch=4, max_epochs=3, metrics={2: {"mIoU": 0.5}, 4: {"mIoU": 0.4}})


def test_resume_continuity_checks_every_step_a_run_stopped_early_reaches_and_leaves_out_the_rest():
    """early_stop ends the run at step 4: resume_at=range(1, 13) checks steps 1 to 4 and passes."""
    hooks = [evaluate_every(2, miou), early_stop("mIoU", patience=1), save_every(2), log_every(1)]
    assert simulate(hooks, **STOPS_AT_4).states[0].progress.global_step == 4
    assert_resume_continuity(hooks, resume_at=range(1, 13), **STOPS_AT_4)


def test_resume_continuity_still_fails_at_a_step_before_an_early_stop():
    """Leaving out the steps after the stop hides nothing before it: a hook counting outside its slot still fails."""
    hooks = [save_every(2), evaluate_every(2, miou), best_on("mIoU"), early_stop("mIoU", patience=1)]
    hooks.append(CountsOutsideItsSlot())
    with pytest.raises(AssertionError, match="resumed from the checkpoint of step 1"):
        assert_resume_continuity(hooks, resume_at=range(1, 13), **STOPS_AT_4)


def test_resume_continuity_with_every_step_after_an_early_stop_is_refused():
    """resume_at holding only steps the run never reaches checks nothing, so it is a ValueError saying so."""
    hooks = [evaluate_every(2, miou), early_stop("mIoU", patience=1), save_every(2)]
    with pytest.raises(ValueError, match=r"resume_at holds step 5, but the run ended at step 4 .* up to 4"):
        assert_resume_continuity(hooks, resume_at=(5, 6), **STOPS_AT_4)
