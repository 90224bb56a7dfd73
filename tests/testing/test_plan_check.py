"""A run's trace against its plan: published metrics, moments, and the one comparison the notebook and tests use."""

import attrs

import pimm_fn as pf
from pimm_fn.core.effects import Log
from pimm_fn.core.trace import Trace
from pimm_fn.testing.assertions import matches_plan, moments, published_metrics


def accuracy(model):
    """An evaluator, by name in the hooks' identities."""
    return {"acc": 0.5}


HOOKS = [pf.evaluate_every(2, accuracy, name="val"), pf.save_every(3), pf.best_on("acc"), pf.log_every(2)]
SCHEDULE = dict(iters_per_epoch=4, max_epochs=2)
METRICS = {2: {"acc": 0.1}, 4: {"acc": 0.3}, 6: {"acc": 0.2}, 8: {"acc": 0.4}}


def test_plan_returns_the_trace_type_of_a_run():
    """pf.plan returns a Trace (as run.trace is), its hooks shown by identity, equal to a tuple of its entries."""
    planned = pf.plan(HOOKS, metrics=METRICS, **SCHEDULE)
    assert isinstance(planned, Trace) and planned == tuple(planned) and isinstance(planned[:2], Trace)
    assert planned.hooks == (
        "evaluate_every(2, accuracy, name='val')",
        "save_every(3)",
        "best_on('acc')",
        "log_every(2)",
    )


def test_published_metrics_are_what_plan_takes_as_metrics():
    """The metrics a trace published, by step, feed plan back the evaluations' values."""
    planned = pf.plan(HOOKS, metrics=METRICS, **SCHEDULE)
    assert published_metrics(planned) == METRICS
    assert published_metrics(pf.plan([pf.save_every(2)], **SCHEDULE)) == {}


def test_a_trace_matches_the_plan_it_came_from_even_with_other_log_numbers():
    """A trace whose Log values differ from the plan's placeholders still matches: logs compare by step and kind."""
    planned = pf.plan(HOOKS, metrics=METRICS, **SCHEDULE)
    losses = [
        attrs.evolve(e, effect=attrs.evolve(e.effect, values={"loss": 1.5})) if isinstance(e.effect, Log) else e
        for e in planned
    ]
    assert losses != list(planned) and matches_plan(losses, HOOKS, **SCHEDULE)
    assert moments(losses) == moments(planned)


def test_a_trace_that_differs_from_its_plan_does_not_match():
    """A missing effect, another schedule or another hook list is a mismatch."""
    planned = pf.plan(HOOKS, metrics=METRICS, **SCHEDULE)
    assert not matches_plan(planned[:-1], HOOKS, **SCHEDULE)
    assert not matches_plan(planned, HOOKS, iters_per_epoch=4, max_epochs=3)
    assert not matches_plan(planned, HOOKS[:2], **SCHEDULE)
