"""Training(exact_retry=False): no RNG kept and no optimizer watch per step; a retry goes on, warned as not exact."""

import pytest
import torch

import pimm_fn as pf
import pimm_fn.runtime.step.driver as driver
from _tiny_workload import FailsOnce, TinyNet, dataset


def _run(model, tmp_path=None, **training):
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        torch.utils.data.DataLoader(dataset(), batch_size=8),
        max_epochs=2,
        training=pf.Training(**training),
        watching=pf.Watching(console=False),
    )


@pytest.mark.parametrize("exact", [True, False])
def test_the_rng_is_kept_before_each_forward_only_with_exact_retry(monkeypatch, exact):
    taken = []
    original = driver.torch_rng
    monkeypatch.setattr(driver, "torch_rng", lambda: taken.append(1) or original())
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
