"""A NaN loss's advice works for the step in use, and on_nonfinite='skip' leaves its update out with a built-in step.

The interruption line never says "run() continues exactly" (which raises again); a custom step_fn is never told
to skip, which loop() refuses for it.
"""

import math
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf
from _tiny_workload import NaNAt, loader


def _run(model, save_dir, **kwargs):
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader("plain", 8),
        hooks=[pf.save_every(2), pf.log_every(1)],
        max_epochs=2,
        save_dir=save_dir,
        watching=pf.Watching(progress=False),
        **kwargs,
    )


def test_the_nan_interruption_line_says_what_works_and_following_it_finishes(tmp_path, capsys):
    """The line says run() would raise again (it does) and to resume with skip or a lower lr; doing so trains on."""
    torch.manual_seed(0)
    run = _run(NaNAt(5), tmp_path)
    with pytest.raises(pf.NonFiniteLossError, match="global step 5 .*resume='auto'"):
        run()
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "interrupted at step" in line]
    assert "continues exactly" not in line and "run() would raise this again" in line, line
    assert "resume='auto'" in line and "on_nonfinite='skip'" in line and "lower lr" in line
    assert str(run.interrupted) in line
    with pytest.raises(pf.NonFiniteLossError, match="global step 5 "):
        run()  # as the line says: continuing raises again
    run.ctx.close()

    resumed = _run(NaNAt(1), tmp_path, resume="auto", training=pf.Training(on_nonfinite="skip"))
    assert resumed.state.progress.global_step == 4  # the last checkpoint, before the NaN
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        resumed()
    assert any(issubclass(w.category, pf.NonFiniteLossWarning) for w in said)
    assert resumed.state.finished and all(torch.isfinite(p).all() for p in resumed.ctx.model.parameters())


def _state_of(run) -> dict:
    """What an update changes: the weights, the optimizer's state, the scheduler's and the scaler's, the gradients."""
    optimizer = run.ctx.optimizer
    return {
        "weights": {k: v.clone() for k, v in run.ctx.model.state_dict().items()},
        "steps": [float(s["step"]) for s in optimizer.state.values()],
        "scheduler": run.ctx.scheduler.last_epoch if run.ctx.scheduler is not None else None,
        "scale": run.ctx.scaler.get_scale() if run.ctx.scaler is not None else None,
        "grads": [p.grad for p in run.ctx.model.parameters()],
    }


def _steps_around(run, at: int) -> tuple:
    """The state before and after global step ``at``, and the warnings said on the way there."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        while run.state.progress.global_step < at - 1:
            run.step()
        before = _state_of(run)
        run.step()
    return before, _state_of(run), [str(w.message) for w in said if issubclass(w.category, pf.NonFiniteLossWarning)]


def test_skip_with_a_train_step_leaves_the_update_of_a_nan_loss_out():
    """TrainStep() under on_nonfinite='skip': the NaN step changes no weight, optimizer or scheduler state, zeroes the
    gradients and warns; the run trains on to finite weights."""
    torch.manual_seed(0)
    model = NaNAt(3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    run = pf.loop(
        model,
        optimizer,
        loader("plain", 8),
        max_epochs=2,
        step_fn=pf.TrainStep(clip_grad_norm=1.0),
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9),
        training=pf.Training(on_nonfinite="skip"),
        watching=pf.Watching(console=False, progress=False),
    )
    before, after, said = _steps_around(run, 3)
    assert all(torch.equal(before["weights"][k], after["weights"][k]) for k in before["weights"])
    assert after["steps"] == before["steps"] == [2.0] * 4 and after["scheduler"] == before["scheduler"] == 2
    assert all(g is None for g in after["grads"]) and run.state.progress.global_step == 3
    assert said == [
        "the training loss is nan at global step 3 (batch index 2 of epoch 0, counting from 0): its "
        "optimizer step was skipped (the step still counts); 1 non-finite loss(es) so far"
    ]
    run()
    assert run.state.finished and all(torch.isfinite(p).all() for p in model.parameters())


def test_skip_with_the_supervised_step_under_fp16_accumulation_and_clipping_keeps_the_scaler_consistent():
    """A NaN sample in one micro-batch: that optimizer step is left out (weights, Adam, scaler scale untouched, no
    unscale pending), and the next steps unscale and clip as usual."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 4, generator=g), torch.randint(0, 3, (48,), generator=g)
    x[4 * 8 + 1, 2] = float("nan")  # in batch 8 (of 4 samples): the 1st micro-batch of optimizer step 5 (accumulate=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    step = pf.TrainStep(loss_fn=torch.nn.functional.cross_entropy, precision="fp16", accumulate=2, clip_grad_norm=1.0)
    run = pf.loop(
        model,
        torch.optim.Adam(model.parameters(), lr=0.01),
        DataLoader(TensorDataset(x, y), batch_size=4),
        step_fn=step,
        hooks=[pf.log_every(1)],
        max_epochs=2,
        training=pf.Training(on_nonfinite="skip"),
        watching=pf.Watching(console=False, progress=False),
    )
    before, after, said = _steps_around(run, 5)
    assert all(torch.equal(before["weights"][k], after["weights"][k]) for k in before["weights"])
    assert after["steps"] == before["steps"] == [4.0] * 4 and after["scale"] == before["scale"]
    assert all(g is None for g in after["grads"]) and len(said) == 1 and "global step 5 " in said[0]
    assert not run.ctx.scaler._per_optimizer_states  # nothing unscaled and left pending: the next unscale_ may run
    with warnings.catch_warnings(record=True) as more:
        warnings.simplefilter("always")
        run()
    assert sum(issubclass(w.category, pf.NonFiniteLossWarning) for w in more) == 1  # the same sample in epoch 1
    assert run.state.progress.global_step == 12 and all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isnan(run.history.columns("train")["loss"][4]) and "grad_norm" in run.history.columns("train")


def test_a_custom_step_fn_gets_advice_naming_only_what_works_for_it(tmp_path, capsys):
    """A plain step_fn's NaN: the error and the interruption line name warn and a skip in the step, never
    on_nonfinite='skip' (which loop() refuses for it); doing as they say trains on."""

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        optimizer.zero_grad()
        loss = model(batch)["loss"]
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    def build(model, **kwargs):
        return _run(model, tmp_path, step_fn=step, **kwargs)

    torch.manual_seed(0)
    run = build(NaNAt(5))
    with pytest.raises(pf.NonFiniteLossError) as raised:
        run()
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "interrupted at step" in line]
    for text in (str(raised.value), line):
        assert "skip" not in text.replace("leave optimizer.step() out", ""), text
        assert "resume='auto'" in text and "have your step_fn leave optimizer.step() out" in text
    assert "Pass loop(training=pimm_fn.Training(on_nonfinite='warn')) to warn and go on" in str(raised.value)
    run.ctx.close()
    with pytest.raises(ValueError, match="on_nonfinite='skip' needs a built-in step"):
        build(NaNAt(1), resume="auto", training=pf.Training(on_nonfinite="skip"))
    resumed = build(NaNAt(1), resume="auto", training=pf.Training(on_nonfinite="warn"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        resumed()
    assert resumed.state.finished and any(issubclass(w.category, pf.NonFiniteLossWarning) for w in said)
