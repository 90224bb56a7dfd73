"""loader_evaluator in one process: sums finished into metrics, torchmetrics, namespaced names, and its refusals."""

import pytest
import torch
import torchmetrics
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset

import pimm_fn as pf
from pimm_fn.runtime.evaluation.loader_evaluator import shard_of


def _data(n=10):
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.5))


def accuracy(outputs, batch):
    _, y = batch
    return {"acc": (outputs.argmax(-1) == y).sum(), "count": len(y)}


def _by_hand(model, data) -> float:
    x, y = data.tensors
    with torch.no_grad():
        return float((model.eval()(x).argmax(-1) == y).float().mean())


def test_per_batch_sums_are_finished_into_the_mean_over_the_count():
    """10 samples in batches of 4, 4, 2: 'acc' is the right answers over all 10, named 'val/acc'."""
    model, data = _model(), _data()
    evaluator = pf.loader_evaluator(DataLoader(data, batch_size=4), accuracy)
    assert evaluator(model.eval()) == {"val/acc": pytest.approx(_by_hand(model, data))}


def test_torchmetrics_metrics_are_reset_updated_and_computed_under_their_names():
    """A dict of torchmetrics (and a MetricCollection) give the same accuracy as the sums, evaluated twice alike."""
    model, data = _model().eval(), _data()
    acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
    evaluator = pf.loader_evaluator(DataLoader(data, batch_size=4), {"acc": acc}, name="test")
    expected = {"test/acc": pytest.approx(_by_hand(model, data))}
    assert evaluator(model) == expected and evaluator(model) == expected  # reset between evaluations
    collection = torchmetrics.MetricCollection(
        {"acc": torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")}
    )
    assert pf.loader_evaluator(DataLoader(data, batch_size=3), collection, name="test")(model) == expected


def test_the_training_rng_stream_is_the_same_after_an_evaluation():
    """A shuffled loader draws its seed from the torch RNG; the evaluator gives the stream back."""
    evaluator = pf.loader_evaluator(DataLoader(_data(), batch_size=4, shuffle=True), accuracy)
    before = torch.get_rng_state()
    evaluator(_model().eval())
    assert torch.equal(torch.get_rng_state(), before)


def test_in_a_loop_the_evaluator_runs_in_eval_mode_and_publishes_namespaced_metrics(tmp_path):
    """Dropout is off during the evaluation (the result is deterministic) and best_on reads 'val/acc'."""
    model, data = _model(), _data()
    seen = []

    def recording(outputs, batch):
        seen.append(model.training)
        return accuracy(outputs, batch)

    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        DataLoader(data, batch_size=5),
        step_fn=_step,
        hooks=[
            pf.evaluate_every(2, pf.loader_evaluator(DataLoader(data, batch_size=4), recording)),
            pf.best_on("val/acc"),
        ],
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(console=False, progress=False),
    )
    state = run()
    assert seen == [False] * (2 + 3) and model.training  # the sanity check's 2 batches, then an evaluation's 3
    assert state.best == {"val/acc": pytest.approx(_by_hand(model, data))}


def _step(model, optimizer, batch, *, scheduler=None, scaler=None):
    x, y = batch
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.detach()}


def test_a_metric_of_the_wrong_shape_is_refused_when_made_or_when_it_returns():
    """One argument instead of (outputs, batch), something not a metric, a vector instead of a sum: each said."""
    loader = DataLoader(_data(), batch_size=4)
    with pytest.raises(
        TypeError,
        match=r"'metric' must be callable as fn\(outputs, batch\) -> \{name: per-batch "
        r"sum\} \(got .*<lambda>' with signature \(outputs\)\)",
    ):
        pf.loader_evaluator(loader, lambda outputs: {})
    with pytest.raises(TypeError, match="'metric' must be fn.*, a torchmetrics Metric .* \\(got int: 3\\)"):
        pf.loader_evaluator(loader, 3)
    vector = pf.loader_evaluator(loader, lambda outputs, batch: {"right": outputs.argmax(-1)})
    with pytest.raises(TypeError, match=r"metric 'right' is a tensor of 4 elements; return one sum per batch"):
        vector(_model())


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_a_loader_that_cannot_be_split_by_index_is_refused_on_several_ranks_with_the_fix():
    """An IterableDataset or a custom batch sampler cannot be sharded by index: shard=False is the way out."""
    with pytest.raises(TypeError, match="cannot split an IterableDataset over 2 ranks by index: pass shard=False"):
        shard_of(DataLoader(_Stream()), 0, 2)

    class Pairs(BatchSampler):
        pass

    custom = DataLoader(_data(), batch_sampler=Pairs(SequentialSampler(range(10)), 2, False))
    with pytest.raises(TypeError, match="its own batch_sampler \\(Pairs\\) over 2 ranks: pass shard=False"):
        shard_of(custom, 1, 2)


def test_a_shard_holds_every_world_th_sample_with_no_padding():
    """11 samples over 2 ranks: 6 and 5, together each once (a DistributedSampler gives 6 and 6)."""
    data = TensorDataset(torch.arange(11))
    shards = [[int(i) for (batch,) in shard_of(DataLoader(data, batch_size=4), r, 2) for i in batch] for r in (0, 1)]
    assert shards == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9]]


def test_the_evaluator_gives_evaluate_every_its_name():
    """evaluate_every names it after the evaluator's name, so two loader evaluators never collide."""
    val = pf.loader_evaluator(DataLoader(_data()), accuracy)
    other = pf.loader_evaluator(DataLoader(_data()), accuracy, name="val2")
    assert repr(pf.evaluate_every(5, val)) == "evaluate_every(5, val)"
    assert repr(pf.evaluate_every(5, other)) == "evaluate_every(5, val2)"
