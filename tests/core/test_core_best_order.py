"""A best-model write comes after the other effects of its evaluation: the evaluation's log line first."""

import pytest

import pimm_fn as pf
from pimm_fn.core.effects import Log, SaveCheckpoint, WriteBest
from pimm_fn.testing import simulate


def accuracy(model):
    return {"acc": 0.5}


METRICS = {2: {"acc": 0.5}, 4: {"acc": 0.7}, 6: {"acc": 0.6}}
ORDERS = {
    "best_on before log_every": lambda: [pf.evaluate_every(2, accuracy), pf.best_on("acc"), pf.log_every(3)],
    "log_every before best_on": lambda: [pf.evaluate_every(2, accuracy), pf.log_every(3), pf.best_on("acc")],
}


def _moments(trace) -> list:
    """(step, what) of the evaluation logs and best writes, in execution order."""
    return [(e.step, "eval log" if isinstance(e.effect, Log) else "best") for e in trace
            if isinstance(e.effect, WriteBest) or isinstance(e.effect, Log) and e.effect.kind.startswith("eval")]


@pytest.mark.parametrize("order", ORDERS)
def test_the_evaluation_log_precedes_the_best_write_it_caused_in_any_hook_order(order):
    """Wherever best_on stands, WriteBest runs after the evaluation's Log (it runs_last), in plan and simulation."""
    hooks = ORDERS[order]()
    planned = pf.plan(hooks, iters_per_epoch=6, max_epochs=1, metrics=METRICS)
    expected = [(2, "eval log"), (2, "best"), (4, "eval log"), (4, "best"), (6, "eval log")]
    simulated = simulate(hooks, world_size=2, iters_per_epoch=6, max_epochs=1, metrics=METRICS)
    assert _moments(planned) == _moments(simulated.traces[0]) == expected


def test_a_save_at_an_evaluation_step_still_follows_the_best_write():
    """The best write runs last within its evaluation's follow-up, so a later saver's checkpoint records it."""
    hooks = [pf.evaluate_every(2, accuracy), pf.save_every(2), pf.log_every(2), pf.best_on("acc")]
    planned = pf.plan(hooks, iters_per_epoch=4, max_epochs=1, metrics=METRICS, outputs=())
    kinds = [type(e.effect).__name__ + (f":{e.effect.kind}" if isinstance(e.effect, Log) else "")
             for e in planned if e.step == 2]
    assert kinds == ["Evaluate", "Log:eval/accuracy", "WriteBest", "SaveCheckpoint", "Log:train"]
    assert WriteBest.runs_last and not SaveCheckpoint(2).runs_last
