"""A step a hook is called for builds only what its hooks see: no State, and one AfterStep."""

import attrs
import pytest
import torch

import pimm_fn as pf
from pimm_fn.core import events as ev
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.state import State

from _tiny_workload import FailsOnce, TinyNet


@attrs.frozen
class _EveryStep:
    """Called for every ``AfterStep``; counts the steps in its slot, so the fold must hand it one."""

    events = (ev.AfterStep,)

    def init(self):
        return 0

    def update(self, slot, state, event):
        return slot + 1, state, ()

    def __call__(self, state, event):
        return called_plainly(self, state, event)


@attrs.frozen
class _BeforeEveryStep(_EveryStep):
    """The same, called for ``BeforeStep`` too."""

    events = (ev.BeforeStep, ev.AfterStep)

    def update(self, slot, state, event):
        return (slot + 1, state, ()) if event.__class__ is ev.AfterStep else (slot, state, ())


@attrs.frozen
class _Unchanged(_EveryStep):
    """Called for every ``AfterStep``; returns its slot and the state as they came."""

    def update(self, slot, state, event):
        return slot, state, ()


def _batches(n):
    g = torch.Generator().manual_seed(0)
    return [(x, x.sum(1, keepdim=True)) for x in torch.randn(n, 8, 4, generator=g)]


def _run(tmp_path, hook, steps=12):
    torch.manual_seed(0)
    model = TinyNet()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _batches(steps),
        hooks=[hook],
        max_epochs=1,
        save_dir=tmp_path,
    )


def _built_per_step(monkeypatch, run, cls, steps=6):
    """Values of ``cls`` built per step over ``steps`` walked steps (``__init__`` calls, counted on the way through)."""
    run.run(steps=2)  # past the epoch's opening
    real, count = cls.__init__, []

    def counting(self, *args, **kwargs):
        count.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counting)
    run.run(steps=steps)
    monkeypatch.undo()
    return len(count) / steps


def test_walked_steps_build_no_state_only_the_one_run_returns(monkeypatch, tmp_path):
    """A step's hooks are handed a StepState: six walked steps build one State in all, the one run() returns.

    Whether the hook keeps its slot, changes it, or is called for BeforeStep too.
    """
    for name, hook in (("a", _Unchanged()), ("b", _EveryStep()), ("c", _BeforeEveryStep())):
        assert _built_per_step(monkeypatch, _run(tmp_path / name, hook), State) * 6 == 1, name


def test_a_step_whose_outputs_a_hook_reads_builds_one_afterstep(monkeypatch, tmp_path):
    """The outputs are read before the event is built, so it is built once, with floats."""
    assert _built_per_step(monkeypatch, _run(tmp_path, _EveryStep()), ev.AfterStep) == 1


def _walk(run, steps=12):
    """``(progress, position, slots)`` after each step, to the end."""
    seen = []
    for _ in range(steps):
        run.step()
        seen.append((run.state.progress, run.state.position, run.state.slots))
    return seen


def test_skipping_an_unwanted_beforestep_ends_where_walking_it_does(tmp_path):
    """Progress, position and slots after every step, the trace and the weights equal those of a run whose hook
    sees BeforeStep."""
    skipping = _run(tmp_path / "a", _EveryStep())
    skipped = _walk(skipping)
    walking = _run(tmp_path / "b", _BeforeEveryStep())
    assert skipped == _walk(walking)
    assert skipping.state.finished and [e.effect for e in skipping.trace] == [e.effect for e in walking.trace]
    assert all(torch.equal(p, q) for p, q in zip(skipping.ctx.model.parameters(), walking.ctx.model.parameters()))


def test_a_train_step_interrupted_after_an_unwanted_beforestep_continues_exactly(tmp_path):
    """The interrupted step trains again from the same batch and RNG: weights and slots equal an uninterrupted run."""
    torch.manual_seed(0)
    model = FailsOnce(at=5)
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _batches(12),
        hooks=[_EveryStep()],
        max_epochs=1,
        save_dir=tmp_path / "a",
    )
    with pytest.raises(RuntimeError, match="a failing forward"):
        run()
    assert run.interrupted.step == 5 and run.interrupted.phase == "the train step"
    run()
    plain = _run(tmp_path / "b", _EveryStep())
    plain()
    assert run.state.slots == plain.state.slots == (12,)
    assert all(torch.equal(p, q) for p, q in zip(run.ctx.model.parameters(), plain.ctx.model.parameters()))
