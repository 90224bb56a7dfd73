"""The name evaluate_every shows is the one a loader_evaluator's metrics are published under."""

import torch
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf
from test_loader_evaluator import _step, accuracy


def _data(n=8):
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


def test_the_hooks_name_wins_and_namespaces_the_loader_evaluators_metrics(tmp_path):
    """evaluate_every(..., loader_evaluator(name="val"), name="test"): the metrics and the best say 'test/acc'."""
    torch.manual_seed(0)
    model, data = torch.nn.Linear(4, 3), _data()
    evaluator = pf.loader_evaluator(DataLoader(data, batch_size=4), accuracy, name="val")
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        DataLoader(data, batch_size=4),
        step_fn=_step,
        hooks=[pf.evaluate_every(2, evaluator, name="test"), pf.best_on("test/acc")],
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(console=False, progress=False),
    )
    state = run()
    assert set(state.metrics) == {"test/acc"} and set(state.best) == {"test/acc"}
    assert evaluator.name == "val"  # the user's value is left as it was


def test_one_loader_evaluator_under_two_hook_names_publishes_each_under_its_own():
    """The same evaluator in two evaluate_every hooks named apart: two evaluators, 'a/acc' and 'b/acc'."""
    from pimm_fn.core.fold import chain
    from pimm_fn.runtime.engine.implied import Implied

    evaluator = pf.loader_evaluator(DataLoader(_data(), batch_size=4), accuracy)
    implied = Implied.of(chain(pf.evaluate_every(2, evaluator, name="a"), pf.evaluate_every(3, evaluator, name="b")))
    model = torch.nn.Linear(4, 3).eval()
    with torch.no_grad():
        assert set(implied.evaluators["a"](model)) == {"a/acc"}
        assert set(implied.evaluators["b"](model)) == {"b/acc"}
    assert implied.evaluators["a"].named("a") is implied.evaluators["a"]
