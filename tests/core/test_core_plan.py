"""plan(): dry runs of hook lists, with exact steps."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate, Log, SaveCheckpoint, WriteBest
from pimm_fn.core.fold import TraceEntry
from pimm_fn.core.plan import plan
from pimm_fn.hooks import best_on, evaluate_every, log_every, save_every


def validate(model):
    return {"miou": 0.0}


def saves(trace):
    return [(t.step, t.event, t.effect) for t in trace if isinstance(t.effect, SaveCheckpoint)]


def stepped(k):
    """The AfterStep a dry run delivers: the default step's output name with its placeholder."""
    return ev.AfterStep(k, {"loss": 0.0})


def test_plan_save_every_4_with_10_iters_and_3_epochs():
    """save_every(4), 10 iters x 3 epochs: 4..28 on the step cadence (20 deferred past epoch 1) and a final 30."""
    trace = plan([save_every(4)], iters_per_epoch=10, max_epochs=3)
    assert trace == (
        TraceEntry(4, stepped(4), SaveCheckpoint(4), 0),
        TraceEntry(8, stepped(8), SaveCheckpoint(8), 0),
        TraceEntry(12, stepped(12), SaveCheckpoint(12), 0),
        TraceEntry(16, stepped(16), SaveCheckpoint(16), 0),
        TraceEntry(20, ev.AfterEpoch(1), SaveCheckpoint(20, deferred=True), 0),
        TraceEntry(24, stepped(24), SaveCheckpoint(24), 0),
        TraceEntry(28, stepped(28), SaveCheckpoint(28), 0),
        TraceEntry(30, ev.AfterTrain(), SaveCheckpoint(30, final=True), 0),
    )


@pytest.mark.parametrize("hooks", [[log_every(100), save_every(4)], [save_every(4), log_every(100)]])
def test_plan_deferred_save_lands_after_the_epochs_end_effects(hooks):
    """The save at step 20 executes at AfterEpoch(1) after the epoch log, wherever the logger stands in the list."""
    trace = plan(hooks, iters_per_epoch=10, max_epochs=3)
    at_20 = [(t.event, t.effect) for t in trace if t.step == 20]
    assert at_20 == [
        (ev.AfterEpoch(1), Log(20, "epoch", {"epoch": 1, "loss": 0.0})),
        (ev.AfterEpoch(1), SaveCheckpoint(20, deferred=True)),
    ]


def test_plan_never_saves_a_step_twice():
    """save_every(5) with 10x3 saves 5, 10, ..., 30, epoch ends at AfterEpoch, and no final save."""
    trace = plan([save_every(5)], iters_per_epoch=10, max_epochs=3)
    assert saves(trace) == [
        (5, stepped(5), SaveCheckpoint(5)),
        (10, ev.AfterEpoch(0), SaveCheckpoint(10, deferred=True)),
        (15, stepped(15), SaveCheckpoint(15)),
        (20, ev.AfterEpoch(1), SaveCheckpoint(20, deferred=True)),
        (25, stepped(25), SaveCheckpoint(25)),
        (30, ev.AfterEpoch(2), SaveCheckpoint(30, deferred=True)),
    ]


def test_plan_snapshots_flag_is_carried():
    """save_every(n, snapshots=True) requests snapshot saves, the final one included."""
    trace = plan([save_every(4, snapshots=True)], iters_per_epoch=10, max_epochs=1)
    assert [t.effect for t in trace] == [
        SaveCheckpoint(4, snapshot=True),
        SaveCheckpoint(8, snapshot=True),
        SaveCheckpoint(10, snapshot=True, final=True),
    ]


def test_plan_from_start_step_continues_the_cadence():
    """A plan resumed at step 13 saves from 16 on, as the uninterrupted run does."""
    full = plan([save_every(4)], iters_per_epoch=10, max_epochs=3)
    resumed = plan([save_every(4)], iters_per_epoch=10, max_epochs=3, start_step=13)
    assert [t.step for t in resumed] == [16, 20, 24, 28, 30]
    assert resumed == tuple(t for t in full if t.step > 13)


def test_plan_from_epoch_end_start_step():
    """A plan resumed at the epoch-ending step 10 starts with epoch 1."""
    resumed = plan([save_every(5), log_every(100)], iters_per_epoch=10, max_epochs=2, start_step=10)
    assert [(t.step, type(t.event).__name__, type(t.effect).__name__) for t in resumed] == [
        (15, "AfterStep", "SaveCheckpoint"),
        (20, "AfterEpoch", "Log"),
        (20, "AfterEpoch", "SaveCheckpoint"),
    ]


def test_plan_start_step_out_of_range_raises():
    """A start_step past the end of training raises ValueError."""
    with pytest.raises(ValueError, match=r"start step must be in \[0, 30\] \(got 31\)"):
        plan([save_every(4)], iters_per_epoch=10, max_epochs=3, start_step=31)


def test_plan_answers_evaluations_from_metrics():
    """metrics={step: values} feeds evaluations; best_on reacts with WriteBest at those steps."""
    hooks = [evaluate_every(5, validate), best_on("miou")]
    trace = plan(
        hooks, iters_per_epoch=5, max_epochs=4, metrics={5: {"miou": 0.3}, 10: {"miou": 0.2}, 15: {"miou": 0.4}}
    )
    assert [(t.step, t.effect) for t in trace] == [
        (5, Evaluate("validate", 5)),
        (5, WriteBest("miou", 0.3, 5)),
        (10, Evaluate("validate", 10)),
        (15, Evaluate("validate", 15)),
        (15, WriteBest("miou", 0.4, 15)),
        (20, Evaluate("validate", 20)),
    ]
    assert trace[1].event == ev.MetricsPublished({"miou": 0.3}, "validate", 5)


def test_plan_metrics_may_be_a_callable():
    """metrics may be a callable (step, rank) -> values."""
    trace = plan(
        [evaluate_every(2, validate), best_on("m", mode="min")],
        iters_per_epoch=6,
        max_epochs=1,
        metrics=lambda step, rank: {"m": 10 - step},
    )
    assert [t.effect for t in trace if isinstance(t.effect, WriteBest)] == [
        WriteBest("m", 8, 2),
        WriteBest("m", 6, 4),
        WriteBest("m", 4, 6),
    ]


def test_plan_rejects_bad_metrics():
    """metrics that are neither mapping nor callable raise TypeError naming the argument."""
    with pytest.raises(TypeError, match="'metrics' must be a mapping"):
        plan([], iters_per_epoch=1, max_epochs=1, metrics=[1])


def test_plan_of_no_hooks_is_empty():
    """With no hooks nothing executes."""
    assert plan([], iters_per_epoch=3, max_epochs=2) == ()


@given(n=st.integers(1, 12), iters=st.integers(1, 12), epochs=st.integers(0, 4))
def test_plan_is_deterministic(n, iters, epochs):
    """Planning the same hooks twice gives equal traces."""
    hooks = [evaluate_every(n, validate), best_on("miou"), save_every(n), log_every(n)]
    metrics = {s: {"miou": (s * 7 % 5) / 5} for s in range(iters * epochs + 1)}
    assert plan(hooks, iters_per_epoch=iters, max_epochs=epochs, metrics=metrics) == plan(
        hooks, iters_per_epoch=iters, max_epochs=epochs, metrics=metrics
    )


@given(n=st.integers(1, 15), iters=st.integers(1, 12), epochs=st.integers(0, 5))
def test_save_cadence_is_exact(n, iters, epochs):
    """Saved steps are {k*n} plus the final step if not already saved, each exactly once."""
    trace = saves(plan([save_every(n)], iters_per_epoch=iters, max_epochs=epochs))
    total = iters * epochs
    cadence = list(range(n, total + 1, n))
    expected = cadence + ([total] if total and total not in cadence else [])
    assert [step for step, _, _ in trace] == expected
    for step, event, effect in trace:
        # deferred exactly when the step ends an epoch
        if step % iters == 0:
            assert event == (ev.AfterEpoch(step // iters - 1) if not effect.final else ev.AfterTrain())
        else:
            assert event == (stepped(step) if not effect.final else ev.AfterTrain())
    finals = [effect for _, _, effect in trace if effect.final]
    assert len(finals) == (0 if total % n == 0 else 1)
    if finals:
        assert finals[0] == SaveCheckpoint(total, final=True)


@given(n=st.integers(1, 15), iters=st.integers(1, 12), epochs=st.integers(1, 4), data=st.data())
def test_resumed_plan_matches_the_uninterrupted_tail(n, iters, epochs, data):
    """A plan started from a save step k equals the uninterrupted plan's entries after k."""
    full = plan([save_every(n)], iters_per_epoch=iters, max_epochs=epochs)
    total = iters * epochs
    steps = [t.step for t in full if not t.effect.final and t.step < total]
    if not steps:
        return
    k = data.draw(st.sampled_from(steps))
    resumed = plan([save_every(n)], iters_per_epoch=iters, max_epochs=epochs, start_step=k)
    assert resumed == tuple(t for t in full if t.step > k)


def test_a_hook_reading_the_loss_runs_in_plan():
    """A dry run's AfterStep carries the step's output names (placeholder 0.0), so outputs['loss'] works."""
    from pimm_fn.core.effects import Log

    def loss_alarm(state, event):
        if isinstance(event, ev.AfterStep) and event.outputs["loss"] > 10:
            return state, (Log(event.step, "alarm", {}),)
        return state, ()

    assert plan([loss_alarm], iters_per_epoch=3, max_epochs=1) == ()
    seen = []

    def record(state, event):
        if isinstance(event, ev.AfterStep):
            seen.append(dict(event.outputs))
        return state, ()

    plan([record], iters_per_epoch=2, max_epochs=1, outputs=("loss", "acc"))
    assert seen == [{"loss": 0.0, "acc": 0.0}] * 2
    seen.clear()
    plan([record], iters_per_epoch=2, max_epochs=1, outputs=())
    assert seen == [{}, {}]


def test_plan_outputs_must_be_names():
    """outputs='loss' (a bare string) is refused with the tuple form to use."""
    with pytest.raises(TypeError, match=r"'outputs' must be a tuple of output names, e.g. \('loss',\)"):
        plan([], iters_per_epoch=2, max_epochs=1, outputs="loss")
