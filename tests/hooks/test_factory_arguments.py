"""Every factory argument is checked at construction: a value is accepted exactly when it is valid, else named.

Hypothesis draws values of every kind (None, bools, small ints, floats with
NaN and infinities, short strings, lists, dicts, objects, callables) for one
argument of one factory at a time, the others left valid. An oracle says
whether the value is valid; a valid one builds the hook, any other raises a
``TypeError`` or ``ValueError`` whose message names the argument.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pimm_fn as pf


def val(model):
    return {"acc": 1.0}


def _int(least):
    return lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= least


def _bool(x):
    return isinstance(x, bool)


def _text(x):
    return isinstance(x, str) and bool(x)


def _optional(check):
    return lambda x: x is None or check(x)


def _number(low, high=math.inf, *, above=False):
    def check(x):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            return False
        return (x > low if above else x >= low) and x < high

    return check


def _one_of(*choices):
    return lambda x: isinstance(x, str) and x in choices


def _replacements(x):
    return x is None or isinstance(x, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in x.items())


# (factory, the valid call's positional and keyword arguments, the argument varied, its oracle)
CASES = [
    (pf.save_every, {"n": 5}, "n", _int(1)),
    (pf.save_every, {"n": 5}, "snapshots", _bool),
    (pf.save_every, {"n": 5}, "async_save", _bool),
    (pf.best_on, {"metric": "acc"}, "metric", _text),
    (pf.best_on, {"metric": "acc"}, "mode", _optional(_one_of("max", "min"))),  # None: "max" unsaid
    (pf.evaluate_every, {"n": 2, "fn": val}, "n", _int(0)),
    (pf.evaluate_every, {"n": 2, "fn": val}, "fn", callable),
    (pf.evaluate_every, {"n": 2, "fn": val}, "name", _optional(_text)),
    (pf.evaluate_every, {"n": 2, "fn": val}, "broadcast", _bool),
    (pf.evaluate_every, {"n": 2, "fn": val}, "weights", _optional(_text)),
    (pf.log_every, {"n": 5}, "n", _int(1)),
    (pf.load_weights, {"path": "w.pth"}, "path", _text),
    (pf.load_weights, {"path": "w.pth"}, "replacements", _replacements),
    (pf.load_weights, {"path": "w.pth"}, "strict", _bool),
    (pf.early_stop, {"metric": "acc", "patience": 2}, "metric", _text),
    (pf.early_stop, {"metric": "acc", "patience": 2}, "patience", _int(1)),
    (pf.early_stop, {"metric": "acc", "patience": 2}, "mode", _optional(_one_of("max", "min"))),  # None: "max" unsaid
    (pf.early_stop, {"metric": "acc", "patience": 2}, "min_delta", _number(0)),
    (pf.step_scheduler, {"interval": "step"}, "interval", _one_of("step", "epoch")),
    (pf.step_scheduler, {"on": "loss"}, "on", _text),
    (pf.ema, {"decay": 0.9}, "decay", _number(0, 1)),
    (pf.ema, {"decay": 0.9}, "every", _int(1)),
    (pf.ema, {"decay": 0.9}, "name", _text),
    (pf.TrainStep, {}, "precision", _one_of("32", "bf16", "fp16")),
    (pf.TrainStep, {}, "accumulate", _int(1)),
    (pf.TrainStep, {}, "clip_grad_norm", _optional(_number(0, above=True))),
    (pf.TrainStep, {}, "clip_grad_value", _optional(_number(0, above=True))),
    (pf.TrainStep, {}, "grad_scaler", _bool),
]

ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "max", "min", "step", "epoch", "fp16", "bf16", "32", "acc", "yes", "true", "0"]),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(
        st.one_of(st.text(max_size=2), st.integers()), st.one_of(st.text(max_size=2), st.none()), max_size=2
    ),
    st.just(object()),
    st.just(print),
)


def _call(factory, kwargs):
    if factory is pf.TrainStep:
        return factory(**kwargs)
    first = next(iter(kwargs))  # the factories take their first argument positionally
    return (
        factory(kwargs[first], **{k: v for k, v in kwargs.items() if k != first})
        if first != "on"
        else factory(**kwargs)
    )


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), value=ANYTHING)
def test_a_factory_accepts_exactly_the_valid_values_and_names_the_argument_otherwise(case, value):
    """A valid value builds the hook; any other raises TypeError or ValueError naming the argument."""
    factory, base, argument, valid = case
    kwargs = {**base, argument: value}
    if argument == "interval" and value is None:
        kwargs = {"interval": None}  # neither interval nor on: refused, naming both
    if valid(value):
        _call(factory, kwargs)
        return
    with pytest.raises((TypeError, ValueError)) as raised:
        _call(factory, kwargs)
    assert argument in str(raised.value), str(raised.value)


@pytest.mark.parametrize("factory, base, argument, valid", CASES, ids=[f"{c[0].__name__}-{c[2]}" for c in CASES])
def test_every_case_names_its_factory(factory, base, argument, valid):
    """Each message starts with the factory that refused the value, so a long hook list points at the culprit."""
    with pytest.raises((TypeError, ValueError)) as raised:
        _call(factory, {**base, argument: object()})
    assert str(raised.value).startswith(f"{factory.__name__}") or f"{factory.__name__}(" in str(raised.value)
