"""Mistakes in loop()'s arguments are said at construction; quiet mistakes are warned about once."""

import json
import warnings

import pytest
import torch

import pimm_fn as pf
from _tiny_workload import TinyNet, build, loader


def _loop(**kwargs):
    model = TinyNet()
    arguments = dict(hooks=[], max_epochs=1, watching=pf.Watching(console=False))
    arguments.update(kwargs)
    return pf.loop(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), **arguments)


def acc(model):
    return {"acc": 0.5}


@pytest.mark.parametrize(
    "hooks, match",
    [
        ({pf.log_every(1)}, "must be a list or tuple of hooks, run in that order \\(got set\\)"),
        (pf.log_every(1), r"got _LogEvery \(a single hook: wrap it in a list, \[hook\]\)"),
        ([pf.save_every], r"holds the hook factory save_every itself: call it .* save_every\(\.\.\.\)"),
        ([3], "a hook must be callable"),
    ],
)
def test_a_malformed_hook_list_is_refused_with_the_fix(hooks, match):
    """A set, a single hook, an uncalled factory or a non-callable fails before anything runs, saying what to do."""
    with pytest.raises(TypeError, match=match):
        _loop(hooks=hooks)


def test_the_same_hook_twice_is_refused():
    """Two hooks with one identity cannot both keep a slot in a checkpoint: refused, naming it."""
    with pytest.raises(pf.DuplicateHookError, match=r"identity 'log_every\(2\)' \(positions 0 and 1\)"):
        _loop(hooks=[pf.log_every(2), pf.log_every(2)])


@pytest.mark.parametrize("resume", [True, False, 1, ["auto"]])
def test_resume_must_be_none_auto_or_a_path(resume):
    """resume=True (or any non-path) names the three accepted forms instead of a pathlib TypeError."""
    with pytest.raises(TypeError, match=r"'resume' must be None \(a fresh run\), 'auto' .* or a checkpoint path"):
        _loop(resume=resume)


def test_a_saving_hook_nested_in_a_chain_still_needs_save_dir():
    """The save_dir check sees through chains."""
    with pytest.raises(ValueError, match=r"best_on\('acc'\) write checkpoints or best weights, but save_dir is None"):
        _loop(hooks=[pf.chain(pf.evaluate_every(2, acc), pf.best_on("acc"))])


@pytest.mark.parametrize("max_epochs, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError)])
def test_a_fresh_run_trains_at_least_one_epoch(max_epochs, error):
    """max_epochs < 1 on a fresh run would train nothing: refused."""
    with pytest.raises(error, match="'max_epochs' must be"):
        _loop(max_epochs=max_epochs)


def test_a_saver_before_an_evaluator_is_not_warned_about(tmp_path):
    """save_every(4) listed before evaluate_every(2): its step-4 save runs after step 4's evaluation, so all is well."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pf.ConfigurationWarning)
        _loop(hooks=[pf.save_every(4), pf.evaluate_every(2, acc)], save_dir=tmp_path, max_epochs=2)


def test_a_best_on_metric_no_evaluator_publishes_is_refused_with_the_guess(tmp_path):
    """best_on('accuracy') while the evaluator publishes 'acc': a ValueError at its first evaluation, with the guess."""
    run = _loop(hooks=[pf.evaluate_every(1, acc), pf.best_on("accuracy")], save_dir=tmp_path, max_epochs=1)
    with pytest.raises(ValueError) as raised:
        run.run(steps=3)
    assert str(raised.value) == (
        "best_on('accuracy') waits for metric 'accuracy', but the evaluators publish ['acc']: did you mean 'acc'?"
    )
    assert run.state.progress.global_step == 1


def test_two_best_on_metrics_keep_one_best_file_each(tmp_path):
    """best_on('acc') and best_on('loss', mode='min') write model_best_acc and model_best_loss, not one file."""

    def scores(model):
        return {"acc": 0.5, "loss": 0.25}

    _, run = build(
        tmp_path, hooks=[pf.evaluate_every(2, scores), pf.best_on("acc"), pf.best_on("loss", mode="min")], max_epochs=1
    )
    run()
    model_dir = tmp_path / "model"
    assert not (model_dir / "model_best.pth").exists()
    assert json.loads((model_dir / "model_best_acc.json").read_text())["metric"] == "acc"
    assert json.loads((model_dir / "model_best_loss.json").read_text())["metric"] == "loss"
    assert (model_dir / "model_best_acc.pth").is_file() and (model_dir / "model_best_loss.pth").is_file()


def test_one_best_on_keeps_model_best(tmp_path):
    """With a single tracked metric the file keeps its usual name, model_best.pth."""
    _, run = build(tmp_path, hooks=[pf.evaluate_every(2, acc), pf.best_on("acc")], max_epochs=1)
    run()
    assert (tmp_path / "model" / "model_best.pth").is_file()
