"""early_stop and step_scheduler: fed events, planned, simulated on several ranks."""

import math
import pickle

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import codec
from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core import hook_list
from pimm_fn.core.effects import Evaluate, SaveCheckpoint, StepScheduler, Stop
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import plan
from pimm_fn.hooks import EarlyStopState, early_stop, evaluate_every, save_every, step_scheduler
from pimm_fn.testing import assert_collective_agreement, assert_resume_continuity, simulate
from _hook_helpers import at, deliver


def val(model):
    return None


def published(consistent=True, **values):
    return ev.MetricsPublished(values, "val", 0, consistent=consistent)


def stop_steps(trace) -> list:
    return [e.step for e in trace if isinstance(e.effect, Stop)]


def moments(entries) -> list:
    """(step, event type, effect, hook) of each entry: a trace without the steps' rank-local outputs."""
    return [(e.step, type(e.event), e.effect, e.hook) for e in entries]


# -- early_stop: fed events ------------------------------------------------------------------------


def test_first_value_is_the_best_and_counts_nothing():
    """The first published value becomes the best; no evaluation without improvement yet."""
    state = at(4, EarlyStopState())
    assert early_stop("acc", patience=2)(state, published(acc=0.5)) == (
        attrs.evolve(state, slot=EarlyStopState(0.5, 0)),
        (),
    )


def test_stop_is_emitted_once_when_the_count_reaches_patience():
    """Evaluations without improvement count up; Stop comes exactly when the count reaches patience, once."""
    hook = early_stop("acc", patience=2)
    state = at(6, EarlyStopState(0.5, 0))
    state, effects = hook(state, published(acc=0.5))  # a tie does not improve
    assert (state.slot, effects) == (EarlyStopState(0.5, 1), ())
    state, effects = hook(state, published(acc=0.4))
    reason = "early_stop('acc', patience=2): acc has not improved on 0.5 for 2 evaluation(s)"
    assert (state.slot, effects) == (EarlyStopState(0.5, 2), (Stop(6, reason),))
    state, effects = hook(state, published(acc=0.3))  # the closing epoch's evaluation: no second Stop
    assert (state.slot, effects) == (EarlyStopState(0.5, 3), ())


def test_improvement_resets_the_count():
    """A strictly better value becomes the best and resets the count to zero."""
    state = at(8, EarlyStopState(0.5, 2))
    out, effects = early_stop("acc", patience=3)(state, published(acc=0.51))
    assert (out.slot, effects) == (EarlyStopState(0.51, 0), ())


@pytest.mark.parametrize(
    "mode, value, improves",
    [
        ("max", 0.61, True),
        ("max", 0.6, False),
        ("max", 0.55, False),
        ("min", 0.39, True),
        ("min", 0.4, False),
        ("min", 0.45, False),
    ],
)
def test_improvement_must_beat_the_best_by_more_than_min_delta(mode, value, improves):
    """With best 0.5 and min_delta 0.1, only values beyond 0.6 (max) or below 0.4 (min) improve."""
    state = at(3, EarlyStopState(0.5, 1))
    out, _ = early_stop("m", patience=5, mode=mode, min_delta=0.1)(state, published(m=value))
    assert out.slot == (EarlyStopState(value, 0) if improves else EarlyStopState(0.5, 2))


@pytest.mark.parametrize("best", [None, 0.5])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "0.9", None, True])
def test_nan_and_non_numbers_never_improve_and_count(best, value):
    """NaN, +/-inf (or a non-number) is never a best, not even the first; it counts as no improvement."""
    state = at(3, EarlyStopState(best, 0))
    out, effects = early_stop("m", patience=1)(state, published(m=value))
    assert out.slot == EarlyStopState(best, 1)
    assert [type(e) for e in effects] == [Stop]


def test_rank_local_metric_is_refused_with_advice():
    """A value published without broadcast cannot drive a stop every rank takes: ValueError says broadcast=True."""
    state = at(3, EarlyStopState())
    with pytest.raises(
        ValueError,
        match=r"early_stop\('acc', patience=2\) got 'acc' from evaluator 'val' as a "
        r"rank-local value .* Evaluate with broadcast=True",
    ):
        early_stop("acc", patience=2)(state, published(consistent=False, acc=0.5))


def test_rank_local_metrics_without_the_metric_are_ignored():
    """Another evaluator's rank-local metrics (not this metric) change nothing."""
    state = at(3, EarlyStopState(0.5, 1))
    assert early_stop("acc", patience=2)(state, published(consistent=False, throughput=9.0)) == (state, ())
    assert early_stop("acc", patience=2)(state, published(loss=0.1)) == (state, ())


def test_a_near_miss_name_may_be_another_evaluators_and_changes_nothing():
    """'miou' beside early_stop('mIoU') may be another evaluator's metric: no error here (the run's Advice
    refuses a typo once every evaluator has published)."""
    state = at(3, EarlyStopState())
    hook = early_stop("mIoU", patience=2)
    assert hook(state, published(miou=0.5)) == (state, ())
    assert hook(state, published(consistent=False, miou=0.5)) == (state, ())


def test_early_stop_declares_what_the_protocol_needs():
    """It listens to MetricsPublished, reads its metric, emits Stop and is rank-consistent."""
    d = protocol.declared(early_stop("acc", patience=2))
    assert d.events == (ev.MetricsPublished,) and d.reads_metrics == ("acc",)
    assert Stop in d.emits and d.rank_consistent


@pytest.mark.parametrize(
    "hook, text",
    [
        (early_stop("acc", patience=2), "early_stop('acc', patience=2)"),
        (
            early_stop("loss", patience=5, mode="min", min_delta=0.01),
            "early_stop('loss', patience=5, mode='min', min_delta=0.01)",
        ),
    ],
)
def test_early_stop_repr_reads_like_the_call_and_pickles(hook, text):
    """The repr is the factory call; the hook survives a pickle round trip."""
    assert repr(hook) == text
    assert pickle.loads(pickle.dumps(hook)) == hook


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(metric="acc", patience=0), ValueError, "early_stop: 'patience' must be an int >= 1 (got 0)"),
        (dict(metric="acc", patience=1.5), ValueError, "early_stop: 'patience' must be an int >= 1 (got 1.5)"),
        (dict(metric="", patience=1), TypeError, "early_stop: 'metric' must be a non-empty str (got '')"),
        (
            dict(metric="acc", patience=1, mode="best"),
            ValueError,
            "early_stop: 'mode' must be one of ['max', 'min'] (got 'best')",
        ),
        (
            dict(metric="acc", patience=1, min_delta=-0.1),
            ValueError,
            "early_stop: 'min_delta' must be a finite number >= 0 (got -0.1)",
        ),
        (
            dict(metric="acc", patience=1, min_delta=math.nan),
            ValueError,
            "early_stop: 'min_delta' must be a finite number >= 0 (got nan)",
        ),
    ],
)
def test_early_stop_refuses_bad_arguments(kwargs, error, message):
    """Bad configuration fails at construction, naming the argument and the value."""
    with pytest.raises(error) as info:
        early_stop(**kwargs)
    assert str(info.value) == message


def test_early_stop_state_round_trips_through_a_checkpoint():
    """EarlyStopState is registered: it encodes and decodes to an equal value."""
    slot = EarlyStopState(0.25, 3)
    assert codec.loads(codec.dumps(slot)) == slot


# -- early_stop: planned and simulated -------------------------------------------------------------


SCORES = {2: 0.1, 4: 0.2, 6: 0.3, 8: 0.3, 10: 0.25, 12: 0.2, 14: 0.1, 16: 0.5}
STACK = [evaluate_every(2, val), early_stop("acc", patience=3), save_every(5)]


def metrics(step, rank):
    return {"acc": SCORES[step]} if step in SCORES else None


def test_plan_ends_the_run_at_the_stop_with_the_closing_events():
    """Stopped mid-epoch at step 12: the epoch closes, no step 13 trains, the final save is at 12."""
    trace = plan(STACK, iters_per_epoch=5, max_epochs=4, metrics=metrics)
    assert [(e.step, type(e.event).__name__, type(e.effect).__name__) for e in trace][-4:] == [
        (10, "AfterEpoch", "SaveCheckpoint"),
        (12, "AfterStep", "Evaluate"),
        (12, "MetricsPublished", "Stop"),
        (12, "AfterTrain", "SaveCheckpoint"),
    ]
    assert trace[-1].effect == SaveCheckpoint(12, final=True)


def test_simulated_ranks_stop_with_the_plan():
    """On 3 simulated ranks every rank stops at the plan's step with the plan's collective effects."""
    planned = plan(STACK, iters_per_epoch=5, max_epochs=4, metrics=metrics)
    result = simulate(STACK, world_size=3, iters_per_epoch=5, max_epochs=4, metrics=metrics)
    assert_collective_agreement(result)
    for rank in range(3):
        assert moments(result.collective(rank)) == moments(planned)
        assert result.states[rank].stop == planned[-2].effect.reason
        assert result.states[rank].finished and result.states[rank].progress.global_step == 12


def test_resume_continues_to_the_same_stop():
    """Killed and resumed at any step up to the stop, the run stops where the uninterrupted one did."""
    assert_resume_continuity(
        STACK, resume_at=range(1, 13), world_size=2, iters_per_epoch=5, max_epochs=4, metrics=metrics
    )


def _expected_stop(values, patience, mode, min_delta):
    """The index of the evaluation that stops, from the rule stated in early_stop's docstring."""
    best, waited = None, 0
    for i, value in enumerate(values):
        if not math.isnan(value) and (
            best is None or (value > best + min_delta if mode == "max" else value < best - min_delta)
        ):
            best, waited = value, 0
            continue
        waited += 1
        if waited == patience:
            return i
    return None


values = st.one_of(st.sampled_from([0.0, 0.5, 1.0, math.nan]), st.floats(-2, 2, allow_nan=False))


@given(
    stream=st.lists(values, min_size=1, max_size=12),
    patience=st.integers(1, 4),
    mode=st.sampled_from(["max", "min"]),
    min_delta=st.sampled_from([0.0, 0.25]),
    every=st.integers(0, 3),
    iters=st.integers(1, 4),
    epochs=st.integers(1, 4),
)
def test_plan_and_simulation_stop_at_the_same_step_for_any_metric_stream(
    stream, patience, mode, min_delta, every, iters, epochs
):
    """For any metric stream, plan and a 2-rank simulation stop at the same step, the one the rule gives.

    Shrinks towards short streams of simple values, patience 1 and one epoch.
    """
    hooks = [evaluate_every(every, val), early_stop("m", patience=patience, mode=mode, min_delta=min_delta)]
    steps = [s for s in range(1, iters * epochs + 1) if (s % every == 0 if every else s % iters == 0)]
    feed = dict(zip(steps, stream))

    def source(step, rank):
        return {"m": feed[step]} if step in feed else None

    planned = plan(hooks, iters_per_epoch=iters, max_epochs=epochs, metrics=source)
    result = simulate(hooks, world_size=2, iters_per_epoch=iters, max_epochs=epochs, metrics=source)
    index = _expected_stop([feed[s] for s in steps if s in feed], patience, mode, min_delta)
    expected = [] if index is None else [steps[index]]
    assert stop_steps(planned) == expected
    last = steps[index] if index is not None else iters * epochs
    for rank in range(2):
        assert moments(result.collective(rank)) == moments(planned)
        assert result.states[rank].progress.global_step == last and result.states[rank].finished


# -- step_scheduler ----------------------------------------------------------------------------------


def test_step_interval_steps_after_every_step():
    """step_scheduler('step') requests one StepScheduler per step, on every step."""
    trace = plan([step_scheduler("step")], iters_per_epoch=3, max_epochs=2)
    assert [(e.step, type(e.event)) for e in trace] == [(s, ev.AfterStep) for s in range(1, 7)]
    assert {e.effect for e in trace} == {StepScheduler(s) for s in range(1, 7)}


def test_epoch_interval_steps_at_each_epochs_end_including_one_a_stop_closes():
    """step_scheduler('epoch') steps at every AfterEpoch, an epoch closed early by a stop included."""
    hooks = [evaluate_every(2, val), early_stop("acc", patience=1), step_scheduler("epoch")]
    trace = plan(hooks, iters_per_epoch=3, max_epochs=4, metrics={2: {"acc": 1.0}, 4: {"acc": 0.0}})
    assert [(e.step, type(e.event)) for e in trace if isinstance(e.effect, StepScheduler)] == [
        (3, ev.AfterEpoch),
        (4, ev.AfterEpoch),
    ]


def test_on_metric_steps_with_each_published_value():
    """step_scheduler(on=...) steps after each publication of the metric, carrying its value."""
    trace = plan(
        [evaluate_every(2, val), step_scheduler(on="loss")],
        iters_per_epoch=4,
        max_epochs=1,
        metrics={2: {"loss": 0.5}, 4: {"acc": 1.0}},
    )
    assert [e.effect for e in trace] == [Evaluate("val", 2), StepScheduler(2, "loss", 0.5), Evaluate("val", 4)]


def test_on_metric_refuses_rank_local_values():
    """A rank-local value would step each rank's scheduler differently: ValueError says broadcast=True."""
    hook = step_scheduler(on="loss")
    with pytest.raises(ValueError, match=r"step_scheduler\(on='loss'\) got 'loss' .* broadcast=True"):
        hook(at(2), published(consistent=False, loss=0.5))
    assert hook(at(2), published(Loss=0.5)) == (at(2), ())  # another evaluator's name: the run's Advice judges typos


def test_step_scheduler_ignores_events_of_other_intervals():
    """Fed directly, each interval reacts only to its own event."""
    state = at(3)
    assert step_scheduler("step")(state, ev.AfterEpoch(0)) == (state, ())
    assert step_scheduler("epoch")(state, ev.AfterStep(3)) == (state, ())
    assert step_scheduler("epoch")(state, published(loss=1.0)) == (state, ())
    assert deliver(step_scheduler("epoch"), state, ev.AfterEpoch(0)) == (state, (StepScheduler(3),))


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        ((), {}, ValueError, "step_scheduler: pass an interval, 'step' or 'epoch', or on='<metric>'"),
        (("step",), {"on": "loss"}, ValueError, "exactly one of them (got interval='step', on='loss')"),
        (
            ("val_loss",),
            {},
            ValueError,
            "'interval' must be 'step' or 'epoch' (got 'val_loss'); to step on a metric, pass on='val_loss'",
        ),
        ((1,), {}, ValueError, "step_scheduler: 'interval' must be one of ['step', 'epoch'] (got 1)"),
        ((), {"on": ""}, TypeError, "step_scheduler: 'on' must be a non-empty str (got '')"),
    ],
)
def test_step_scheduler_refuses_bad_arguments(args, kwargs, error, message):
    """Neither or both of interval and on, or a wrong value, fail at construction with the fix."""
    with pytest.raises(error) as info:
        step_scheduler(*args, **kwargs)
    assert message in str(info.value)


def test_step_scheduler_repr_declarations_and_pickle():
    """The repr is the factory call; it declares StepScheduler, its event and metric; it pickles."""
    for hook, text, events, reads in [
        (step_scheduler("step"), "step_scheduler('step')", (ev.AfterStep,), ()),
        (step_scheduler("epoch"), "step_scheduler('epoch')", (ev.AfterEpoch,), ()),
        (step_scheduler(on="val_loss"), "step_scheduler(on='val_loss')", (ev.MetricsPublished,), ("val_loss",)),
    ]:
        d = protocol.declared(hook)
        assert (repr(hook), d.events, d.reads_metrics) == (text, events, reads)
        assert StepScheduler in d.emits and d.rank_consistent
        assert pickle.loads(pickle.dumps(hook)) == hook


def test_emits_any_finds_a_scheduler_stepping_hook_at_any_depth():
    """emits_any looks through nested chains and ignores hooks that do not declare emits."""

    def undeclared(state, event):
        return state, ()

    nested = [save_every(2), chain(undeclared, chain(step_scheduler("epoch")))]
    assert hook_list.emits_any(nested, StepScheduler)
    assert not hook_list.emits_any([save_every(2), undeclared], StepScheduler)
    assert hook_list.emits_any(nested, SaveCheckpoint)
