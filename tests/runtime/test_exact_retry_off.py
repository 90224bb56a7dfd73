"""Training(exact_retry=False): no RNG kept and no optimizer watch per step; a retry goes on, warned as not exact."""

import pytest
import torch

import pimm_fn as pf
import pimm_fn.runtime.step.driver as driver
from _tiny_workload import FailsOnce, TinyNet, dataset


def _run(model, hooks=(), handlers=None, data=None, **training):
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        torch.utils.data.DataLoader(dataset() if data is None else data, batch_size=8),
        hooks=list(hooks),
        max_epochs=2,
        training=pf.Training(**training),
        watching=pf.Watching(console=False),
        handlers=handlers,
    )


def _counting_rng_captures(monkeypatch, module) -> list:
    """A list that grows by one at each ``torch_rng()`` capture ``module`` makes."""
    taken = []
    original = module.torch_rng
    monkeypatch.setattr(module, "torch_rng", lambda: taken.append(1) or original())
    return taken


@pytest.mark.parametrize("exact", [True, False])
def test_the_rng_is_kept_before_each_forward_only_with_exact_retry(monkeypatch, exact):
    taken = _counting_rng_captures(monkeypatch, driver)
    torch.manual_seed(0)
    run = _run(TinyNet(), exact_retry=exact)
    run()
    assert len(taken) == (run.state.progress.global_step if exact else 0)


@pytest.mark.parametrize("exact", [True, False])
def test_the_optimizer_is_watched_only_with_exact_retry(exact):
    torch.manual_seed(0)
    run = _run(TinyNet(), exact_retry=exact)
    run.run(steps=1)
    assert bool(run.ctx.optimizer._optimizer_step_pre_hooks) is exact


def test_without_exact_retry_run_goes_on_after_a_failing_step_and_warns_it_is_not_exact():
    torch.manual_seed(0)
    run = _run(FailsOnce(3), exact_retry=False)
    with pytest.warns(pf.ResumeNotExactWarning, match="exact_retry=False"):
        with pytest.raises(RuntimeError, match="a failing forward"):
            run()
    run()
    assert run.finished and run.state.progress.global_step == 10


def test_with_exact_retry_the_same_failure_continues_without_a_warning(recwarn):
    torch.manual_seed(0)
    run = _run(FailsOnce(3))
    with pytest.raises(RuntimeError, match="a failing forward"):
        run()
    run()
    assert run.finished and not [w for w in recwarn if w.category is pf.ResumeNotExactWarning]


class _ReadFailsOnce(torch.utils.data.Dataset):
    """Samples noised from torch's RNG as they are read (an augmentation); the ``at``-th read raises once."""

    def __init__(self, at):
        self.x, self.y = dataset().tensors
        self.at, self.reads = at, 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.reads += 1
        if self.reads == self.at:
            raise OSError("a flaky read")
        return self.x[i] + 0.01 * torch.randn(()), self.y[i]


@pytest.mark.parametrize("exact", [True, False])
def test_a_fetch_that_raised_is_fetched_again_and_warned_as_not_exact_only_without_exact_retry(exact, recwarn):
    """The same samples either way (the cursor goes back); without exact retry the augmentation draws from the RNG as
    it is, and the retry says so."""
    torch.manual_seed(0)
    data, model = _ReadFailsOnce(at=20), TinyNet()  # the 20th read: inside step 3's batch of 8
    run = _run(model, data=data, exact_retry=exact)
    with pytest.raises(OSError, match="a flaky read"):
        run()
    said = [str(w.message) for w in recwarn if w.category is pf.ResumeNotExactWarning]
    assert said == ([] if exact else [said[0]]) and (
        exact or "while fetched with Training(exact_retry=False)" in said[0]
    )
    run()
    assert run.finished and run.state.progress.global_step == 10 and run.state.progress.samples_seen == 80


@pytest.mark.parametrize("exact", [True, False])
def test_the_rng_is_kept_before_each_effect_only_with_exact_retry(monkeypatch, exact):
    """ema(0.9) asks for an UpdateEma on each of the 10 steps: the RNG is kept before each with exact retry, else never."""
    import pimm_fn.runtime.engine.walker as walker

    taken = _counting_rng_captures(monkeypatch, walker)
    torch.manual_seed(0)
    run = _run(TinyNet(), [pf.ema(0.9)], exact_retry=exact)
    run()
    updates = [e for e in run.trace if type(e.effect).__name__ == "UpdateEma"]
    assert len(updates) == 10 and len(taken) == (10 if exact else 0)


_LOGGED = []


def _log_fails_once(effect, state, ctx):
    """The Log handler of the test below: its second call raises, once."""
    _LOGGED.append(effect.step)
    if len(_LOGGED) == 2:
        raise OSError("a flaky log write")
    return ()


@pytest.mark.parametrize("exact", [True, False])
def test_an_effect_that_raised_runs_again_and_is_warned_as_not_exact_only_without_exact_retry(exact, recwarn):
    _LOGGED.clear()
    torch.manual_seed(0)
    run = _run(TinyNet(), [pf.log_every(2)], {pf.effects.Log: _log_fails_once}, exact_retry=exact)
    with pytest.raises(OSError, match="a flaky log write"):
        run()
    assert run.interrupted.phase.startswith("effect Log(step=4")
    said = [str(w.message) for w in recwarn if w.category is pf.ResumeNotExactWarning]
    assert said == ([] if exact else [said[0]])
    assert exact or "effect Log at step 4 was interrupted with Training(exact_retry=False)" in said[0]
    run()
    assert run.finished and _LOGGED[:4] == [2, 4, 4, 5] and _LOGGED.count(4) == 2  # only it ran twice


@pytest.mark.parametrize("exact", [True, False])
def test_an_epochs_drain_that_raised_is_drained_again_and_warned_as_not_exact_only_without_exact_retry(exact, recwarn):
    """Two steps of two batches take 4 of a StatefulDataLoader's 5: the epoch's end drains the fifth, a fetch. One
    that raised is drained again; without exact retry its augmentation draws from the RNG as it is, and the retry
    says so, as a step's fetch does."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    torch.manual_seed(0)
    data, model = _ReadFailsOnce(at=35), TinyNet()  # the 35th read: in the fifth batch, drained at epoch 0's end
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        StatefulDataLoader(data, batch_size=8),
        max_epochs=2,
        step_fn=pf.TrainStep(accumulate=2),
        training=pf.Training(exact_retry=exact),
        watching=pf.Watching(console=False),
    )
    with pytest.raises(OSError, match="a flaky read"):
        run()
    assert run.state.progress.global_step == 2  # epoch 0's two steps trained: its end stopped
    said = [str(w.message) for w in recwarn if w.category is pf.ResumeNotExactWarning]
    assert said == ([] if exact else [said[0]]) and (exact or "while drained at the epoch's end" in said[0])
    run()
    assert run.finished and run.state.progress.global_step == 4 and run.state.progress.samples_seen == 64
