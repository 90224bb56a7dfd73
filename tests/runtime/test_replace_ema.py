"""``run.replace`` with an ``ema`` hook: the average is made, kept or dropped as a run built with the new hooks."""

import pytest
import torch

import pimm_fn as pf

import _tiny_workload as tw

DECAY = 0.5


def _logs():
    return pf.chain(pf.log_every(5), name="x")


def _with_ema(decay=DECAY):
    return pf.chain(pf.ema(decay), pf.log_every(5), name="x")


@pytest.mark.filterwarnings("ignore:resumed from .* nothing is left to train")
def test_an_ema_added_by_replace_averages_the_weights_from_its_first_update(tmp_path):
    """Added after step 2: the average starts as the weights of step 3, lerps each step, and is checkpointed."""
    model, run = tw.build(tmp_path, hooks=[_logs(), pf.save_every(3)], max_epochs=2)
    run.run(steps=2)
    run.replace("x", _with_ema())
    expected = None
    while not run.finished:
        run.step()
        now = {k: v.detach().clone() for k, v in model.named_parameters()}
        expected = now if expected is None else {k: expected[k] + (1 - DECAY) * (now[k] - expected[k]) for k in now}
    average = run.ctx.extra_state["ema"]
    assert average.updates == 8 and average.params.keys() == expected.keys()
    assert all(torch.allclose(average.params[k], expected[k], atol=1e-6) for k in expected)
    _, resumed = tw.build(tmp_path, hooks=[_with_ema(), pf.save_every(3)], max_epochs=2, resume="auto")
    assert tw.same(resumed.ctx.extra_state["ema"].state_dict(), average.state_dict())


def test_an_ema_in_both_versions_keeps_its_average_and_one_removed_drops_it(tmp_path):
    """A new decay goes on from the same average; replaced by a hook keeping none, the run keeps no average."""
    _, run = tw.build(tmp_path, hooks=[_with_ema(0.9), pf.save_every(3)], max_epochs=2)
    run.run(steps=3)
    kept = run.ctx.extra_state["ema"]
    run.replace("x", _with_ema(0.5)).run(steps=2)
    assert run.ctx.extra_state["ema"] is kept and kept.updates == 5
    run.replace("x", _logs())
    assert run.ctx.extra_state == {} and run.run().progress.global_step == 10


def test_a_replacement_evaluating_an_average_no_ema_keeps_is_refused_and_changes_nothing(tmp_path):
    """evaluate_every(weights='slow') swapped in without ema(name='slow'): a ValueError naming it; the run is as it was."""
    _, run = tw.build(
        tmp_path, hooks=[_with_ema(), pf.evaluate_every(4, tw.negative_mse, name="val"), pf.save_every(3)], max_epochs=2
    )
    run.run(steps=2)
    hooks, extra = run.hooks, dict(run.ctx.extra_state)
    with pytest.raises(ValueError, match=r"replace: hook .* evaluates weights='slow', but no ema\(name='slow'\)"):
        run.replace(
            "evaluate_every(4, negative_mse, name='val')",
            pf.evaluate_every(4, tw.negative_mse, name="val", weights="slow"),
        )
    assert run.hooks == hooks and run.ctx.extra_state == extra
    assert run.run().progress.global_step == 10
