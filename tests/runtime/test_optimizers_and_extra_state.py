"""Several named optimizers and extra state: checkpointed by name, restored exactly, checked at construction."""

import pytest
import torch

import pimm_fn as pf
from _more_state_workload import GanStep, RunningMean, TinyGan, build, snapshot
from _tiny_workload import TinyNet, loader, same


def _gan(save_dir, *, optimizers=None, hooks=None, resume=None, extra=True, console=False):
    torch.manual_seed(0)
    model = TinyGan()
    optimizers = optimizers or {
        "g": torch.optim.Adam(model.g.parameters(), lr=0.01),
        "d": torch.optim.Adam(model.d.parameters(), lr=0.02),
    }
    if callable(optimizers):
        optimizers = optimizers(model)
    stats = RunningMean()
    run = pf.loop(
        model,
        optimizer=optimizers,
        train_data=loader(),
        step_fn=GanStep(stats),
        hooks=[pf.save_every(3)] if hooks is None else hooks,
        max_epochs=2,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=console),
        training=pf.Training(extra_state={"stats": stats} if extra else None),
    )
    return model, run


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_each_optimizer_and_the_extra_state_come_back_as_saved(tmp_path, async_save):
    """A resume from step 6 holds each optimizer's state, the average and the extra state as they were at step 6."""
    model, run = build(tmp_path, async_save=async_save)
    run.run(steps=6)
    run.ctx.wait_for_save()
    at_save = snapshot(model, run)
    model2, resumed = build(tmp_path, resume="auto", async_save=async_save)
    again = snapshot(model2, resumed)
    for part in ("weights", "optimizers", "ema", "stats"):
        assert same(again[part], at_save[part]), part


def test_the_step_receives_the_dict_of_optimizers(tmp_path):
    """step_fn's 'optimizer' argument is the optimizer= dict, by name."""
    seen = []

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        seen.append(sorted(optimizer))
        return {}

    model = TinyNet()
    opts = {
        "a": torch.optim.SGD(model.hidden.parameters(), lr=0.1),
        "b": torch.optim.SGD(model.out.parameters(), lr=0.1),
    }
    pf.loop(
        model, optimizer=opts, train_data=loader(), step_fn=step, max_epochs=1, watching=pf.Watching(console=False)
    ).run(steps=2)
    assert seen == [["a", "b"], ["a", "b"]]


def test_a_checkpoint_of_other_optimizer_names_is_a_resume_error(tmp_path):
    """Resuming a g/d checkpoint with optimizers named otherwise refuses, naming both sets."""
    _gan(tmp_path)[1].run(steps=3)
    renamed = lambda m: {"gen": torch.optim.Adam(m.g.parameters()), "d": torch.optim.Adam(m.d.parameters())}
    with pytest.raises(pf.ResumeError, match=r"optimizers \['d', 'g'\].*optimizers \['d', 'gen'\]"):
        _gan(tmp_path, optimizers=renamed, resume="auto")


def test_one_optimizer_against_several_is_a_resume_error(tmp_path):
    """A checkpoint of one optimizer cannot resume a run of named ones."""
    torch.manual_seed(0)
    model = TinyNet()
    pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader(),
        hooks=[pf.save_every(2)],
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(console=False),
    ).run(steps=2)

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        return {}

    with pytest.raises(pf.ResumeError, match="one optimizer"):
        pf.loop(
            model,
            optimizer={"a": torch.optim.SGD(model.parameters(), lr=0.1)},
            train_data=loader(),
            step_fn=step,
            max_epochs=1,
            save_dir=tmp_path,
            resume="auto",
            watching=pf.Watching(console=False),
        )


def test_hyperparameter_differences_are_said_per_optimizer(tmp_path):
    """A changed lr of optimizer 'd' is warned about under its name."""
    _gan(tmp_path)[1].run(steps=3)
    changed = lambda m: {
        "g": torch.optim.Adam(m.g.parameters(), lr=0.01),
        "d": torch.optim.Adam(m.d.parameters(), lr=0.5),
    }
    with pytest.warns(pf.ConfigurationWarning, match="optimizer 'd'.*'lr': checkpoint 0.02, new 0.5"):
        _gan(tmp_path, optimizers=changed, resume="auto")


def test_async_saves_gate_every_optimizer(tmp_path):
    """save_every(async_save=True) with two optimizers saves and resumes (the gate is on each optimizer)."""
    model, run = _gan(tmp_path, hooks=[pf.save_every(2, async_save=True)])
    run.run(steps=4)
    assert len(run.ctx.saver.gate.handles) == 2
    run.ctx.wait_for_save()
    _gan(tmp_path, resume="auto")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (lambda sgd: {}, TypeError, "pass the optimizer"),
        (
            lambda sgd: {"optimizers": {"a": sgd}},
            TypeError,
            r"no longer takes optimizers=: pass optimizer=\{name: optimizer",
        ),
        (lambda sgd: {"optimizer": {}}, TypeError, "non-empty dict"),
        (
            lambda sgd: {"optimizer": {"a": object()}},
            TypeError,
            r"optimizer\['a'\] is a object, which has no state_dict",
        ),
    ],
)
def test_optimizer_arguments_are_checked_at_construction(kwargs, error, match):
    """None, the old optimizers=, an empty dict or a stateless object: a clear error before anything runs."""
    model = TinyNet()
    with pytest.raises(error, match=match):
        pf.loop(
            model,
            train_data=loader(),
            step_fn=lambda *a, **k: {},
            max_epochs=1,
            **kwargs(torch.optim.SGD(model.parameters(), lr=0.1)),
        )


def test_the_default_step_refuses_several_optimizers():
    """The built-in step steps one optimizer: a dict of them without a step_fn says so."""
    model = TinyNet()
    with pytest.raises(ValueError, match="built-in train step steps one optimizer"):
        pf.loop(model, optimizer={"a": torch.optim.SGD(model.parameters(), lr=0.1)}, train_data=loader(), max_epochs=1)


def test_extra_state_without_state_dict_is_refused():
    """An extra_state object must have state_dict() and load_state_dict()."""
    model = TinyNet()
    with pytest.raises(TypeError, match=r"extra_state\['bad'\] is a int"):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader(),
            max_epochs=1,
            training=pf.Training(extra_state={"bad": 3}),
        )


def test_extra_state_name_taken_by_an_ema_is_refused():
    """extra_state={'ema': ...} beside pf.ema() clashes, and says to rename one."""
    model = TinyNet()
    with pytest.raises(ValueError, match="rename one"):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader(),
            max_epochs=1,
            hooks=[pf.ema(0.9)],
            training=pf.Training(extra_state={"ema": RunningMean()}),
        )


def test_extra_state_names_on_one_side_only_are_said(tmp_path, capsys):
    """A name the checkpoint lacks goes on as built; a saved name the run lacks is dropped; each with a line."""
    _gan(tmp_path / "a", hooks=[pf.ema(0.9), pf.save_every(3)])[1].run(steps=3)
    _gan(tmp_path / "a", resume="auto", extra=False, console=True)
    assert "dropped the checkpointed extra state ['stats', 'ema']" in capsys.readouterr().out
    _gan(tmp_path / "b", extra=False)[1].run(steps=3)
    _gan(tmp_path / "b", resume="auto", console=True)
    assert "extra state ['stats'] is not in the checkpoint: it goes on as this run built it" in capsys.readouterr().out


def test_an_error_after_the_first_optimizer_stepped_is_not_exact():
    """A step raising between the two optimizers' steps is placed after an optimizer step, and warned about."""

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        optimizer["d"].zero_grad()
        model.d(batch[0]).mean().backward()
        optimizer["d"].step()
        raise RuntimeError("boom")

    model = TinyGan()
    optimizers = {
        "g": torch.optim.SGD(model.g.parameters(), lr=0.1),
        "d": torch.optim.SGD(model.d.parameters(), lr=0.1),
    }
    run = pf.loop(
        model,
        optimizer=optimizers,
        train_data=loader(),
        step_fn=step,
        max_epochs=1,
        watching=pf.Watching(console=False),
    )
    with (
        pytest.warns(pf.ResumeNotExactWarning, match="after optimizer.step"),
        pytest.raises(RuntimeError, match="boom"),
    ):
        run.step()
    assert run.interrupted.phase == "the train step, after the optimizer step"
