"""best_on: strict improvement, NaN, once per publication, near-miss names."""

import math

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.effects import WriteBest
from pimm_fn.hooks import BestState, best_on, evaluate_every
from _hook_helpers import at, run


def published(**values):
    return ev.MetricsPublished(values, "val", 0)


def test_first_value_is_best():
    """The first published value improves on nothing and is written."""
    state = at(5, BestState())
    assert best_on("miou")(state, published(miou=0.25)) == (
        attrs.evolve(state, best={"miou": 0.25}, slot=BestState(0.25, 5)),
        (WriteBest("miou", 0.25, 5),),
    )


@pytest.mark.parametrize(
    "mode, best, value, improves",
    [
        ("max", 0.5, 0.6, True),
        ("max", 0.5, 0.4, False),
        ("max", 0.5, 0.5, False),
        ("min", 0.5, 0.4, True),
        ("min", 0.5, 0.6, False),
        ("min", 0.5, 0.5, False),
        ("max", 0.5, math.inf, False),
        ("min", 0.5, -math.inf, False),
        ("max", 0.5, 1, True),
    ],
)
def test_improvement_is_strict(mode, best, value, improves):
    """Only a strictly better value (per mode) writes; ties do not."""
    state = at(12, BestState(best, 4), best={"miou": best})
    new_state, effects = best_on("miou", mode=mode)(state, published(miou=value))
    if improves:
        assert (new_state, effects) == (
            attrs.evolve(state, best={"miou": value}, slot=BestState(value, 12)),
            (WriteBest("miou", value, 12),),
        )
    else:
        assert (new_state, effects) == (state, ())


@pytest.mark.parametrize("best", [None, 0.5])
@pytest.mark.parametrize("mode", ["max", "min"])
def test_nan_never_improves(best, mode):
    """A NaN value never becomes the best, not even the first one."""
    state = at(3, BestState(best, 1 if best is not None else -1))
    assert best_on("miou", mode=mode)(state, published(miou=math.nan)) == (state, ())


@pytest.mark.parametrize("best", [None, 0.5])
@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_infinity_never_improves(best, mode, value):
    """+/-inf never becomes the best in either mode, not even the first value: no model_best from a diverged run."""
    state = at(3, BestState(best, 1 if best is not None else -1))
    assert best_on("miou", mode=mode)(state, published(miou=value)) == (state, ())


def test_a_finite_value_after_infinity_is_the_best():
    """After an inf publication the next finite value is still judged against the last finite best."""
    hook = best_on("loss", mode="min")
    state, effects = hook(at(3, BestState()), published(loss=-math.inf))
    assert effects == () and state.slot == BestState()
    state, effects = hook(
        attrs.evolve(state, progress=attrs.evolve(state.progress, global_step=6)), published(loss=2.0)
    )
    assert effects == (WriteBest("loss", 2.0, 6),)


@pytest.mark.parametrize("value", ["0.9", None, True, (1.0,)])
def test_non_numbers_never_improve(value):
    """Values that are not numbers (strings, None, bools, tuples) are never a best."""
    state = at(3, BestState())
    assert best_on("miou")(state, published(miou=value)) == (state, ())


def test_unrelated_metrics_are_ignored():
    """A publication without the metric (and no near-miss) changes nothing."""
    state = at(3, BestState(0.5, 2))
    assert best_on("miou")(state, published(loss=0.1, acc=0.9)) == (state, ())
    assert best_on("miou")(state, published()) == (state, ())


# A near-miss name in one publication may be another evaluator's metric: the run's Advice judges typos once
# every evaluator has published (tests/runtime/test_catch_before_training.py, tests/hooks/test_best_on_safety.py).


def test_reacts_only_to_metrics_published():
    """best_on declares MetricsPublished only, so an old metric is never reused at a later step."""
    assert best_on("miou").events == (ev.MetricsPublished,)
    hooks = [evaluate_every(5, lambda model: None, name="val"), best_on("miou")]
    final, rec = run(hooks, iters=5, epochs=3, metrics={5: {"miou": 0.5}, 10: {"loss": 1.0}})
    writes = [effect for _, _, effect, _, _ in rec.seen if isinstance(effect, WriteBest)]
    assert writes == [WriteBest("miou", 0.5, 5)]
    assert final.metrics == {"miou": 0.5, "loss": 1.0} and final.slots[1] == BestState(0.5, 5)


def test_reacts_once_per_publication():
    """Two publications of the same better value write once; of two better values, twice."""
    hook = best_on("miou")
    state = at(5, BestState())
    state, first = hook(state, published(miou=0.5))
    state, second = hook(state, published(miou=0.5))
    state, third = hook(state, published(miou=0.7))
    assert (first, second, third) == ((WriteBest("miou", 0.5, 5),), (), (WriteBest("miou", 0.7, 5),))


def test_two_best_on_hooks_keep_separate_slots():
    """best_on for two metrics tracks each independently in state.best."""
    hooks = [evaluate_every(1, lambda model: None, name="v"), best_on("a"), best_on("b", mode="min")]
    final, _ = run(hooks, iters=3, epochs=1, metrics={1: {"a": 1, "b": 5}, 2: {"a": 3, "b": 7}, 3: {"a": 2, "b": 4}})
    assert final.best == {"a": 3, "b": 4}
    assert final.slots[1:] == (BestState(3, 2), BestState(4, 3))


finite_or_nan = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.just(math.nan))


@given(stream=st.lists(finite_or_nan, max_size=20), mode=st.sampled_from(["max", "min"]))
def test_best_is_monotone_and_strict_for_any_stream(stream, mode):
    """Over any metric stream (with NaN), written bests strictly improve and equal the running best of non-NaN values."""
    hook = best_on("m", mode=mode)
    state = at(1, BestState())
    written = []
    better = (lambda a, b: a > b) if mode == "max" else (lambda a, b: a < b)
    expected = None
    for value in stream:
        state, effects = hook(state, published(m=value))
        written.extend(e.value for e in effects)
        if not math.isnan(value) and (expected is None or better(value, expected)):
            expected = value
            assert effects == (WriteBest("m", value, 1),)
        else:
            assert effects == ()
    assert all(better(b, a) for a, b in zip(written, written[1:]))
    assert state.slot.value == expected
    assert state.best.get("m") == expected
