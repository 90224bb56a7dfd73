"""Mistakes that used to surface hours in are said before the first step (or at the first evaluation, exactly)."""

import warnings

import pytest
import torch

import pimm_fn as pf
from pimm_fn.compat import checkpoint_saver
from _tiny_workload import TinyNet, loader


def _loop(model=None, optimizer=None, **kwargs):
    model = model or TinyNet()
    arguments = dict(hooks=[], max_epochs=1, watching=pf.Watching(console=False, progress=False))
    arguments.update(kwargs)
    return pf.loop(model, optimizer or torch.optim.SGD(model.parameters(), lr=0.1), loader(), **arguments)


def val(model):
    return {"val/mIoU": 0.5}


def val2(model):
    return {"val2/mIoU": 0.25}


def test_an_evaluator_taking_the_model_and_a_loader_is_refused_when_the_hook_is_made():
    """evaluate_every(n, fn) calls fn(model): a (model, loader) signature is refused with the two fixes."""

    def evaluate(model, loader):
        return {}

    with pytest.raises(
        TypeError,
        match=r"evaluate_every: the evaluator .*evaluate\(model, loader\) cannot be called "
        r"as fn\(model\): the loop passes the model alone. Bind the rest first "
        r"\(functools.partial\(fn, loader=val_loader\)\), or let the loop iterate the "
        r"loader: pimm_fn.loader_evaluator\(val_loader, metric_fn\)",
    ):
        pf.evaluate_every(10, evaluate)


def test_two_anonymous_evaluators_are_told_to_take_a_name():
    """Two evaluate_every(n, lambda) share an identity: the error says evaluate_every(..., name=), not chain."""
    with pytest.raises(pf.DuplicateHookError, match=r"give each its own name: evaluate_every\(n, fn, name='...'\)"):
        _loop(hooks=[pf.evaluate_every(2, lambda m: 0.1), pf.evaluate_every(2, lambda m: 0.2)])
    with pytest.raises(ValueError, match=r"two evaluators are named '.*<lambda>'.*evaluate_every\(n, fn, name='...'\)"):
        _loop(hooks=[pf.evaluate_every(2, lambda m: 0.1), pf.evaluate_every(3, lambda m: 0.2)])


def test_an_optimizer_holding_none_of_the_models_parameters_is_refused():
    """Built on another model's parameters, training would never change the model: refused, with the fix."""
    with pytest.raises(
        ValueError,
        match=r"loop: the optimizer holds 4 parameter tensor\(s\), none of them the "
        r"model's \(4\): training would never change the model. Build the optimizer "
        r"on this model's parameters",
    ):
        _loop(TinyNet(), torch.optim.SGD(TinyNet().parameters(), lr=0.1))


def test_an_optimizer_over_part_of_the_model_passes():
    """A fine-tuned head (a subset of the parameters) is legal."""
    model = TinyNet()
    _loop(model, torch.optim.SGD(model.out.parameters(), lr=0.1))


def test_two_best_trackers_of_one_metric_are_refused_whatever_their_modes():
    """Two best_on of one metric, or pimm's CheckpointSaver beside pf.best_on of its metric, share one best file."""
    for hooks, named in (
        (
            [pf.evaluate_every(2, val), pf.best_on("val/mIoU"), pf.best_on("val/mIoU", mode="min")],
            "best_on('val/mIoU') and best_on('val/mIoU', mode='min')",
        ),
        (
            [
                pf.evaluate_every(2, val),
                checkpoint_saver(save_freq=2, metric="val/mIoU", mode="min"),
                pf.best_on("val/mIoU"),
            ],
            "checkpoint_saver(save_freq=2, metric='val/mIoU', mode='min') and best_on('val/mIoU')",
        ),
    ):
        with pytest.raises(ValueError) as info:
            _loop(hooks=hooks, save_dir="unused")
        assert str(info.value) == (
            f"loop: {named} both track the best 'val/mIoU' and write its best weights, which "
            f"one metric has once (one model_best file, one State.best value): keep one of them"
        )


def test_a_metric_another_evaluator_publishes_is_never_taken_for_a_typo(tmp_path):
    """Evaluators publishing 'val/mIoU' and 'val2/mIoU': best_on('val/mIoU') trains through, no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pf.ConfigurationWarning)
        run = _loop(
            hooks=[pf.evaluate_every(2, val2), pf.evaluate_every(2, val), pf.best_on("val/mIoU")], save_dir=tmp_path
        )
        assert run().best == {"val/mIoU": 0.5}


def test_a_misspelt_metric_is_refused_once_every_evaluator_has_published(tmp_path):
    """best_on('val/miou') beside 'val/mIoU': a ValueError at the first evaluation round, naming the right one."""
    run = _loop(
        hooks=[pf.evaluate_every(2, val2), pf.evaluate_every(2, val), pf.best_on("val/miou")], save_dir=tmp_path
    )
    with pytest.raises(
        ValueError,
        match=r"best_on\('val/miou'\) waits for metric 'val/miou', but the evaluators "
        r"publish \['val/mIoU', 'val2/mIoU'\]: did you mean 'val/mIoU'\?",
    ):
        run()
    assert run.state.progress.global_step == 2


def test_the_sanity_check_refuses_a_misspelt_metric_before_the_first_step(tmp_path):
    """Watching(sanity_check=n) runs each evaluator when loop() builds the run: the typo fails there."""
    with pytest.raises(ValueError, match="did you mean 'val/mIoU'"):
        _loop(
            hooks=[pf.evaluate_every(100, val), pf.best_on("val/MIoU")],
            save_dir=tmp_path,
            watching=pf.Watching(console=False, progress=False, sanity_check=2),
        )
    assert not (tmp_path / "model").exists()


def test_the_sanity_check_publishes_nothing_and_leaves_training_as_it_was(tmp_path):
    """With and without the check: the same weights (dropout draws alike), and no best or log from it."""

    def weights(sanity):
        torch.manual_seed(0)
        model = TinyNet()
        val_data = pf.loader_evaluator(
            loader(),
            lambda out, batch: {"loss": out["loss"] * len(batch[0]), "count": len(batch[0])},
            forward=lambda model, batch: model(batch),
        )
        run = _loop(
            model,
            hooks=[pf.evaluate_every(100, val_data), pf.best_on("val/loss", mode="min")],
            save_dir=tmp_path / str(sanity),
            watching=pf.Watching(console=False, progress=False, sanity_check=sanity),
        )
        assert run.state.best == {} and len(run.history) == 0
        run()
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(weights(0), weights(1)))


def test_the_sanity_check_option_is_checked():
    """A negative number of batches is refused by Watching, with what to pass."""
    with pytest.raises(
        ValueError, match="'sanity_check' must be None or an int >= 0 \\(got -1\\); pass the number of batches"
    ):
        pf.Watching(sanity_check=-1)


class Counted:
    """A re-iterable validation set that counts the batches drawn from it."""

    def __init__(self, n=4):
        self.data, self.drawn = [next(iter(loader(batch_size=10))) for _ in range(n)], 0

    def __iter__(self):
        for batch in self.data:
            self.drawn += 1
            yield batch


def _sums(outputs, batch):
    return {"acc": -outputs["loss"] * len(batch[0]), "count": len(batch[0])}


def _val(data=None):
    return pf.loader_evaluator(data or Counted(), _sums, forward=lambda model, batch: model(batch))  # "val/acc"


def test_the_sanity_check_refuses_a_bare_name_of_a_loader_evaluators_metric_before_step_1(tmp_path):
    """best_on('acc') beside a loader_evaluator publishing 'val/acc': loop() itself raises, naming 'val/acc' and
    the prefix, after two batches and before any step or any file of a checkpoint."""
    model, data = TinyNet(), Counted()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError) as raised:
        _loop(model, hooks=[pf.evaluate_every(4, _val(data)), pf.save_every(4), pf.best_on("acc")], save_dir=tmp_path)
    assert str(raised.value) == (
        "best_on('acc') waits for metric 'acc', but the evaluators publish ['val/acc']: did "
        "you mean 'val/acc'? (a loader_evaluator puts its name before each metric it publishes)"
    )
    assert data.drawn == 2 and not (tmp_path / "model").exists()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_without_the_sanity_check_a_missing_metric_is_refused_once_every_evaluator_has_published(tmp_path):
    """sanity_check=0: best_on('acc') trains through val's first evaluation (step 2, other has not published yet)
    and is refused at step 3, when other has, naming every published name."""
    run = _loop(
        hooks=[pf.evaluate_every(2, _val()), pf.evaluate_every(3, val2), pf.best_on("acc")],
        save_dir=tmp_path,
        watching=pf.Watching(console=False, progress=False, sanity_check=0),
    )
    with pytest.raises(
        ValueError,
        match=r"^best_on\('acc'\) waits for metric 'acc', but the evaluators publish "
        r"\['val/acc', 'val2/mIoU'\]: did you mean 'val/acc'\?",
    ):
        run()
    assert run.state.progress.global_step == 3 and run.state.best == {}
    with pytest.raises(
        ValueError,
        match="waits for metric 'nowhere', but the evaluators publish "
        r"\['val/mIoU'\]: read one of these, or have an evaluator publish it$",
    ):
        _loop(
            hooks=[pf.evaluate_every(2, val), pf.best_on("nowhere")],
            save_dir=tmp_path / "b",
            watching=pf.Watching(console=False, progress=False, sanity_check=0),
        )()


def test_the_default_sanity_check_runs_two_batches_and_leaves_the_run_as_it_was(tmp_path):
    """Watching() by default draws 2 validation batches in loop(), publishes nothing, and the run then trains to the
    same weights, trace, history and metrics as with sanity_check=0 (dropout and a shuffled loader draw alike)."""

    def trained(sanity):
        torch.manual_seed(0)
        model, data = TinyNet(), Counted()
        watching = (
            pf.Watching(console=False, progress=False)
            if sanity is None
            else pf.Watching(console=False, progress=False, sanity_check=sanity)
        )
        run = _loop(
            model,
            hooks=[pf.evaluate_every(3, _val(data)), pf.best_on("val/acc"), pf.log_every(1)],
            save_dir=tmp_path / str(sanity),
            watching=watching,
            max_epochs=2,
        )
        drawn = data.drawn
        assert run.state.best == {} and len(run.history) == 0 and run.state.metrics == {}
        run()
        return drawn, run, [p.detach().clone() for p in model.parameters()]

    checked, with_it, weights_with = trained(None)
    unchecked, without, weights_without = trained(0)
    assert (checked, unchecked) == (2, 0)
    assert all(torch.equal(a, b) for a, b in zip(weights_with, weights_without))
    assert [repr(e) for e in with_it.trace] == [repr(e) for e in without.trace]
    assert with_it.history.columns("train") == without.history.columns("train")
    assert with_it.state.best == without.state.best and with_it.state.metrics == without.state.metrics


def test_the_default_sanity_check_leaves_an_fn_evaluator_and_an_iterator_to_their_first_evaluation(tmp_path):
    """A plain fn(model) cannot be shortened and an iterator would lose its batches: the default runs neither."""
    calls = []

    def evaluate(model):
        calls.append(1)
        return {"val/mIoU": 0.5}

    batches = iter(Counted().data)
    _loop(hooks=[pf.evaluate_every(4, evaluate), pf.evaluate_every(4, _val(batches), name="it")], save_dir=tmp_path)
    assert calls == [] and len(list(batches)) == 4
