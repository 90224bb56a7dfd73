"""What evaluators return: non-finite metrics never crash training, and wrong types name the evaluator and the key."""

import json

import pytest
import torch

import pimm_fn as pf
from pimm_fn.runtime.errors import NonFiniteMetricWarning
from _tiny_workload import build


def _scores(values):
    """An evaluator publishing ``values[i]`` as 'acc' at its i-th call."""
    calls = []

    def scores(model):
        calls.append(None)
        return {"acc": values[len(calls) - 1]}

    return scores


@pytest.mark.parametrize("mode, bad", [("max", float("inf")), ("max", float("nan")), ("min", float("-inf"))])
def test_a_non_finite_metric_is_ignored_with_a_warning_naming_metric_and_step(tmp_path, mode, bad):
    """inf/NaN/-inf at step 2 never becomes model_best; the warning names 'acc' and step 2; the run finishes."""
    hooks = [pf.evaluate_every(2, _scores([bad, 0.5])), pf.best_on("acc", mode=mode)]
    _, run = build(tmp_path, hooks=hooks, max_epochs=1, training=pf.Training(iters_per_epoch=4))
    with pytest.warns(NonFiniteMetricWarning) as caught:
        run()
    messages = [str(w.message) for w in caught if w.category is NonFiniteMetricWarning]
    assert len(messages) == 1
    assert f"{pf.best_on('acc', mode=mode)!r} got metric 'acc' = {bad!r} at step 2" in messages[0]
    assert run.finished and dict(run.state.best) == {"acc": 0.5}
    assert json.loads((tmp_path / "model" / "model_best.json").read_text()) == {
        "metric": "acc",
        "step": 4,
        "value": 0.5,
    }


@pytest.mark.parametrize(
    "result, error, message",
    [
        ({"acc": "0.5"}, TypeError, "evaluator 'bad' returned metric 'acc' as a str ('0.5'): return numbers"),
        (
            {"acc": [1.0, 2.0]},
            TypeError,
            "evaluator 'bad' returned metric 'acc' as a list ([1.0, 2.0]), which is not one number",
        ),
        ({"acc": None}, TypeError, "evaluator 'bad' returned metric 'acc' as a NoneType (None)"),
        ({"acc": 10**400}, ValueError, "evaluator 'bad' returned metric 'acc' = "),
        (
            [0.5],
            TypeError,
            "evaluator 'bad' must return a mapping of metric names to numbers, a number or None (got list: [0.5])",
        ),
    ],
)
def test_an_evaluator_result_of_the_wrong_type_names_the_evaluator_and_the_key(tmp_path, result, error, message):
    """A metric that is not one number fails at that evaluation, naming the evaluator and the metric."""

    def bad(model):
        return result

    _, run = build(tmp_path, hooks=[pf.evaluate_every(1, bad, name="bad")], max_epochs=1)
    with pytest.raises(error) as raised:
        run()
    assert message in str(raised.value)


def test_a_one_element_tensor_is_a_number_published_under_the_evaluator_name(tmp_path):
    """An evaluator returning torch.tensor(0.25) publishes {'loss_val': 0.25}; a tensor metric value is read too."""

    def loss_val(model):
        return torch.tensor(0.25)

    def both(model):
        return {"acc": torch.tensor([0.75])}

    _, run = build(
        tmp_path,
        hooks=[pf.evaluate_every(2, loss_val, name="loss_val"), pf.evaluate_every(2, both, name="both")],
        max_epochs=1,
    )
    run.run(steps=2)
    assert dict(run.state.metrics) == {"loss_val": 0.25, "acc": 0.75}
