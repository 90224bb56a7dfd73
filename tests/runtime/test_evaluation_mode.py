"""Evaluators run in eval mode under inference mode, and training's mode comes back whatever they did."""

import pytest
import torch

import pimm_fn as pf
from _tiny_workload import TinyNet, loader


def _run(evaluator, seen_training, *, hooks=None, n=2, model=None):
    """A run evaluating every ``n`` steps; its step records the model's training flag each step."""
    torch.manual_seed(0)
    model = model or TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        seen_training.append(model.training)
        return pf.train_step(model, optimizer, batch)

    hooks = hooks or [pf.evaluate_every(n, evaluator, name="val")]
    return model, pf.loop(
        model, optimizer, loader(), step_fn=step, hooks=hooks, max_epochs=1, watching=pf.Watching(console=False)
    )


def test_the_evaluator_runs_in_eval_mode_under_inference_mode():
    """Inside the evaluator every module is in eval mode and torch.inference_mode is on."""
    inside = []

    def evaluator(model):
        inside.append((torch.is_inference_mode_enabled(), [m.training for m in model.modules()]))
        return {"x": 1.0}

    model, run = _run(evaluator, [])
    run.run(steps=2)
    assert inside == [(True, [False, False, False, False])]
    assert model.training and not torch.is_inference_mode_enabled()


def test_an_evaluator_that_leaves_eval_mode_does_not_leak_into_training():
    """An evaluator calling model.eval() and never model.train(): the next steps train in train mode."""
    training = []

    def forgetful(model):
        model.eval()
        return {"x": 1.0}

    model, run = _run(forgetful, training)
    run()
    assert training == [True] * 5 and model.training


def test_each_modules_own_flag_comes_back():
    """A submodule kept in eval mode during training (a frozen layer) stays so; the others train again."""

    def trains_everything(model):
        model.train()
        return {"x": 1.0}

    model = TinyNet()
    model.drop.eval()
    _, run = _run(trains_everything, [], model=model)
    run.run(steps=2)
    assert (model.training, model.hidden.training, model.drop.training) == (True, True, False)


def test_an_evaluator_that_raises_leaves_the_modes_restored():
    """An evaluator raising after model.eval(): the modes are restored, and the fixed run continues."""
    training = []

    def broken(model):
        model.eval()
        raise ValueError("evaluator bug")

    model, run = _run(broken, training)
    with pytest.raises(ValueError, match="evaluator bug"):
        run.run(steps=2)
    assert model.training and all(m.training for m in model.modules())
    run.replace_evaluator("val", lambda model: {"x": 1.0})
    run()
    assert training == [True] * 5


def test_ddp_models_are_evaluated_on_the_wrapper(one_rank_group):
    """With ddp=True the evaluator receives the wrapper in eval mode, and the wrapper trains again after."""
    got = []

    def evaluator(model):
        got.append((type(model).__name__, model.training, model.module.training))
        model.eval()
        return {"x": 1.0}

    torch.manual_seed(0)
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader(),
        hooks=[pf.evaluate_every(2, evaluator)],
        max_epochs=1,
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(ddp=True),
    )
    run.run(steps=3)
    assert got == [("DistributedDataParallel", False, False)]
    assert run.ctx.model.training and model.training


from _process_group import one_rank_group  # noqa: E402,F401 - the fixture above
