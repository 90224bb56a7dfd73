"""evaluate_every: step and epoch cadence, names, broadcast."""

import functools

import pytest

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate
from pimm_fn.hooks import evaluate_every
from _hook_helpers import at, deliver, run


def validate(model):
    return {"miou": 0.5}


class Scorer:
    def __call__(self, model):
        return 1.0


def evaluations(hooks, iters, epochs):
    _, rec = run(hooks, iters=iters, epochs=epochs)
    return [(step, event) for step, event, effect, _, _ in rec.seen if isinstance(effect, Evaluate)]


def test_evaluates_every_n_steps():
    """evaluate_every(n) requests Evaluate(name, k) at every AfterStep(k) with k % n == 0."""
    assert evaluations([evaluate_every(4, validate)], iters=5, epochs=2) == [(4, ev.AfterStep(4)), (8, ev.AfterStep(8))]
    state = at(8)
    assert evaluate_every(4, validate)(state, ev.AfterStep(8)) == (state, (Evaluate("validate", 8),))
    assert deliver(evaluate_every(4, validate), state, ev.AfterStep(7)) == (state, ())


def test_step_cadence_does_not_evaluate_at_epoch_end_event():
    """With n >= 1 an AfterEpoch requests nothing (the epoch-ending step already did if due)."""
    state = at(10, position="AfterEpoch")
    assert evaluate_every(5, validate)(state, ev.AfterEpoch(0)) == (state, ())


def test_n_zero_evaluates_once_per_epoch_at_after_epoch():
    """evaluate_every(0) requests one Evaluate per epoch, at AfterEpoch, for the epoch's last step."""
    assert evaluations([evaluate_every(0, validate)], iters=3, epochs=3) == [
        (3, ev.AfterEpoch(0)),
        (6, ev.AfterEpoch(1)),
        (9, ev.AfterEpoch(2)),
    ]
    state = at(6)
    assert evaluate_every(0, validate)(state, ev.AfterStep(6)) == (state, ())


def test_name_defaults_to_the_callables_name():
    """The evaluator's name is fn's qualified name (a callable object: its class), unless given."""
    assert evaluate_every(1, validate).name == "validate"
    assert evaluate_every(1, Scorer()).name == "Scorer"
    assert evaluate_every(1, validate, name="val").name == "val"
    partial = functools.partial(validate)
    assert evaluate_every(1, partial).name == "partial"


def test_broadcast_flag_reaches_the_effect():
    """broadcast=False is carried into each Evaluate; the default is True."""
    state = at(2)
    assert evaluate_every(2, validate, broadcast=False)(state, ev.AfterStep(2))[1] == (
        Evaluate("validate", 2, broadcast=False),
    )
    assert evaluate_every(2, validate)(state, ev.AfterStep(2))[1][0].broadcast is True


def test_evaluators_maps_name_to_callable():
    """evaluators() gives the interpreter {name: fn}."""
    scorer = Scorer()
    assert evaluate_every(3, validate).evaluators() == {"validate": validate}
    assert evaluate_every(3, scorer, name="score").evaluators() == {"score": scorer}


def test_repr_reads_like_the_call():
    """repr shows n, the function's name, and name/broadcast only when not the defaults."""
    assert repr(evaluate_every(200, validate)) == "evaluate_every(200, validate)"
    assert repr(evaluate_every(0, validate, name="val")) == "evaluate_every(0, validate, name='val')"
    assert repr(evaluate_every(5, validate, broadcast=False)) == "evaluate_every(5, validate, broadcast=False)"


def test_declares_only_step_and_epoch_events():
    """evaluate_every is only called for AfterStep and AfterEpoch."""
    assert evaluate_every(1, validate).events == (ev.AfterStep,)
    assert evaluate_every(0, validate).events == (ev.AfterEpoch,)


@pytest.mark.parametrize(
    "args, kwargs, exc, message",
    [
        ((-1, validate), {}, ValueError, "evaluate_every: 'n' must be an int >= 0 (got -1)"),
        ((1.5, validate), {}, ValueError, "evaluate_every: 'n' must be an int >= 0 (got 1.5)"),
        ((None, validate), {}, ValueError, "evaluate_every: 'n' must be an int >= 0 (got None)"),
        ((1, "validate"), {}, TypeError, "evaluate_every: 'fn' must be callable (got 'validate')"),
        ((1, validate), {"name": ""}, TypeError, "evaluate_every: 'name' must be a non-empty str (got '')"),
        ((1, validate), {"name": 3}, TypeError, "evaluate_every: 'name' must be a non-empty str (got 3)"),
        ((1, validate), {"broadcast": "yes"}, TypeError, "evaluate_every: 'broadcast' must be a bool (got 'yes')"),
    ],
)
def test_evaluate_every_rejects_bad_arguments(args, kwargs, exc, message):
    """Bad evaluate_every arguments raise at construction, naming the argument and value."""
    with pytest.raises(exc) as info:
        evaluate_every(*args, **kwargs)
    assert str(info.value) == message
