"""Changes a resumed or running job used to make in silence: each is now said, and follows one rule."""

import math
import warnings

import pytest
import torch

import pimm_fn as pf
from _tiny_workload import NaNAt, TinyNet, dataset, loader, one_long_epoch, same_weights, weights


def _recording(rows):
    """The default step, noting the inputs of every batch it trains on."""

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        rows.append(batch[0].clone())
        return pf.train_step(model, optimizer, batch, scheduler=scheduler, scaler=scaler)

    return step


def _said(record, category) -> str:
    """The first warning of ``category`` that ``pytest.warns`` recorded (torch may add its own)."""
    return next(str(w.message) for w in record if issubclass(w.category, category))


def _run(save_dir, *, kind="plain", batch_size=8, rows=None, resume=None, hooks=None, **kwargs):
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return pf.loop(
        model,
        optimizer,
        loader(kind, batch_size),
        hooks=[pf.save_every(3)] if hooks is None else hooks,
        max_epochs=2,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=False),
        step_fn=_recording(rows) if rows is not None else None,
        **kwargs,
    )


# -- steps per epoch changed at resume ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "stateful", "generator"])
@pytest.mark.parametrize("batch_size", [4, 12])
def test_another_batch_size_continues_the_epoch_by_samples_consumed(tmp_path, kind, batch_size):
    """Checkpoint at step 3 of 5 (24 samples): batch 4 or 12 continues at sample 24 of the same order, warning with both lengths."""
    original = []
    first = _run(tmp_path, kind=kind, rows=original)
    first.run(steps=5)  # epoch 0 whole; the latest checkpoint is step 3's
    resumed_rows = []
    with pytest.warns(pf.ResumeNotExactWarning) as said:
        run = _run(tmp_path, kind=kind, batch_size=batch_size, rows=resumed_rows, resume="auto")
    message = _said(said, pf.ResumeNotExactWarning)
    steps = -(-40 // batch_size)
    assert f"5 then, {steps} now" in message and "24 samples consumed" in message
    assert f"continues at batch index {24 // batch_size} of {steps}" in message and "global_step stays 3" in message
    p = run.state.progress
    assert (p.global_step, p.epoch, p.iter_in_epoch, p.iters_per_epoch, p.samples_seen) == (
        3,
        0,
        24 // batch_size,
        steps,
        24,
    )
    while run.state.progress.epoch == 0 and not run.state.progress.at_epoch_end:
        run.step()
    assert torch.equal(torch.cat(resumed_rows), torch.cat(original)[24:])  # no sample repeated or skipped
    assert run.state.progress.global_step == 3 + steps - 24 // batch_size


def test_another_batch_size_that_does_not_divide_the_samples_consumed_restarts_the_epoch(tmp_path):
    """24 samples consumed and batch 16: the epoch restarts from its first batch, saying why; global_step is kept."""
    _run(tmp_path).run(steps=4)
    rows = []
    with pytest.warns(pf.ResumeNotExactWarning, match="not a multiple of the new batch size 16") as said:
        run = _run(tmp_path, batch_size=16, rows=rows, resume="auto")
    message = _said(said, pf.ResumeNotExactWarning)
    assert "5 then, 3 now" in message and "epoch 0 restarts from its first batch; global_step stays 3" in message
    p = run.state.progress
    assert (p.global_step, p.iter_in_epoch, p.iters_per_epoch, run.state.position) == (3, 0, 3, "BeforeEpoch")
    for _ in range(3):  # epoch 0 again, in 3 batches of 16, 16 and 8
        run.step()
    assert run.state.progress.global_step == 6 and run.state.position == "AfterEpoch"
    assert sorted(torch.cat(rows)[:, 0].tolist()) == sorted(dataset().tensors[0][:, 0].tolist())  # one whole pass


def test_another_batch_size_at_an_epoch_boundary_only_changes_the_length(tmp_path):
    """A checkpoint at an epoch's end resumes with the new length and no warning: nothing of an epoch was consumed."""
    _run(tmp_path, hooks=[pf.save_every(5)]).run(steps=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pf.ResumeNotExactWarning)
        run = _run(tmp_path, hooks=[pf.save_every(5)], batch_size=4, resume="auto")
    assert run.state.progress.iters_per_epoch == 10 and run.state.progress.global_step == 5
    run()
    assert run.state.progress.global_step == 15 and run.state.finished


# -- optimizer hyper-parameters changed at resume -------------------------------------------------


def _sgd_run(save_dir, resume=None, scheduler=False, **hyper):
    mode = {k: hyper.pop(k) for k in list(hyper) if k == "resume_hyperparameters"}
    torch.manual_seed(0)
    model = TinyNet()
    settings = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0, **hyper}
    optimizer = torch.optim.SGD(model.parameters(), **settings)
    sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5) if scheduler else None
    return pf.loop(
        model,
        optimizer,
        loader("plain", 8),
        hooks=[pf.save_every(3)],
        max_epochs=1,
        save_dir=save_dir,
        resume=resume,
        scheduler=sched,
        watching=pf.Watching(console=True),
        resuming=pf.Resuming(**mode),
    )


def test_a_changed_lr_is_said_and_the_checkpoints_value_wins_by_default(tmp_path, capsys):
    """lr 0.01 against the checkpoint's 0.1: a console line and a ConfigurationWarning name both; 0.1 stays."""
    _sgd_run(tmp_path).run(steps=3)
    capsys.readouterr()
    with pytest.warns(pf.ConfigurationWarning) as said:
        run = _sgd_run(tmp_path, resume="auto", lr=0.01, weight_decay=1e-4)
    message = _said(said, pf.ConfigurationWarning)
    assert "group 0 'lr': checkpoint 0.1, new 0.01" in message
    assert "group 0 'weight_decay': checkpoint 0.0, new 0.0001" in message and "'momentum'" not in message
    assert "keeping the checkpoint's values" in message and message in capsys.readouterr().out
    group = run.ctx.optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["momentum"]) == (0.1, 0.0, 0.9)


def test_resume_hyperparameters_new_applies_this_runs_values(tmp_path):
    """With resume_hyperparameters='new' the run goes on with lr 0.01, its momentum state loaded from the checkpoint."""
    first = _sgd_run(tmp_path)
    first.run(steps=3)
    buffers = [s["momentum_buffer"].clone() for s in first.ctx.optimizer.state.values()]
    with pytest.warns(pf.ConfigurationWarning, match="using this run's values"):
        run = _sgd_run(tmp_path, resume="auto", lr=0.01, resume_hyperparameters="new")
    assert run.ctx.optimizer.param_groups[0]["lr"] == 0.01
    loaded = [s["momentum_buffer"] for s in run.ctx.optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(buffers, loaded))


def test_a_scheduled_lr_is_no_change_but_a_new_initial_lr_is(tmp_path):
    """Under a scheduler the decayed lr is not a difference; another starting lr is, compared as initial_lr."""
    _sgd_run(tmp_path, scheduler=True).run(steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pf.ConfigurationWarning)
        run = _sgd_run(tmp_path, resume="auto", scheduler=True)
    assert run.ctx.optimizer.param_groups[0]["lr"] == 0.05  # the checkpoint's, decayed once
    with pytest.warns(pf.ConfigurationWarning, match="group 0 'initial_lr': checkpoint 0.1, new 0.2"):
        _sgd_run(tmp_path, resume="auto", scheduler=True, lr=0.2)


def test_bad_resume_hyperparameters_and_on_nonfinite_are_refused_at_construction(tmp_path):
    """An unknown value, or 'skip' with a custom step, is a ValueError naming the argument."""
    with pytest.raises(ValueError, match="'resume_hyperparameters' must be 'checkpoint'"):
        _run(tmp_path, resuming=pf.Resuming(resume_hyperparameters="user"))
    with pytest.raises(ValueError, match="'on_nonfinite' must be 'raise', 'skip' or 'warn' \\(got 'ignore'\\)"):
        _run(tmp_path, training=pf.Training(on_nonfinite="ignore"))
    with pytest.raises(ValueError, match="on_nonfinite='skip' needs a built-in step"):
        _run(tmp_path, rows=[], training=pf.Training(on_nonfinite="skip"))


# -- a non-finite loss ----------------------------------------------------------------------------


def _nan_run(at, hooks=(), step_fn=None, **kwargs):
    torch.manual_seed(0)
    model = NaNAt(at)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    run = pf.loop(
        model,
        optimizer,
        loader("plain", 8),
        hooks=list(hooks),
        max_epochs=2,
        scheduler=scheduler,
        step_fn=step_fn,
        watching=pf.Watching(console=False),
        **kwargs,
    )
    return model, run


def test_a_nan_loss_raises_where_the_losses_are_next_read_naming_its_step():
    """With no hook reading the outputs the losses are read at the epoch's end: NaN at step 8 raises there, naming 8."""
    _, run = _nan_run(8)
    with pytest.raises(pf.NonFiniteLossError, match="global step 8 ") as raised:
        run()
    assert "on_nonfinite='skip'" in str(raised.value)
    assert run.state.progress.global_step == 10 and not run.finished
    with pytest.raises(pf.NonFiniteLossError, match="global step 8 "):
        run()  # the losses are kept unread: a retry raises again


def test_a_nan_loss_in_a_long_epoch_no_hook_reads_is_raised_within_wait_at_most_steps():
    """One 3 000-step epoch with no hook reading the outputs: a NaN loss at step 3 raises at step 1 000, not 3 000."""
    from pimm_fn.runtime.engine.outputs import WAIT_AT_MOST

    torch.manual_seed(0)
    model = NaNAt(3)
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        one_long_epoch(3 * WAIT_AT_MOST),
        hooks=[],
        max_epochs=1,
        watching=pf.Watching(console=False),
    )
    with pytest.raises(pf.NonFiniteLossError, match="global step 3 "):
        run()
    assert run.state.progress.global_step == WAIT_AT_MOST and not run.finished


def test_a_nan_loss_read_every_step_names_its_step():
    """A hook reading the outputs every step reads the losses every step: the error names step 8 itself."""
    _, run = _nan_run(8, (pf.log_every(1),))
    run.run(steps=7)
    with pytest.raises(pf.NonFiniteLossError, match="global step 8 "):
        run.step()
    assert run.state.progress.global_step == 7 and run.interrupted is not None


def test_a_nan_loss_is_raised_before_a_later_checkpoint_is_written(tmp_path):
    """The losses are read before a save's hook is called: no checkpoint holds weights trained on a NaN loss."""
    _, run = _nan_run(3, (pf.save_every(4),), save_dir=tmp_path)
    with pytest.raises(pf.NonFiniteLossError, match="global step 3 "):
        run()
    assert pf.checkpoint.latest_checkpoint(tmp_path / "model") is None


@pytest.mark.parametrize("hooks", [(), (pf.log_every(1),)], ids=["quiet", "outputs read"])
def test_skip_leaves_the_weights_unchanged_for_that_batch_and_goes_on(hooks):
    """Under 'skip' the NaN step updates nothing (weights, optimizer, scheduler) but counts; training continues."""
    model, run = _nan_run(3, hooks, training=pf.Training(on_nonfinite="skip"))
    run.run(steps=2)
    before, adam_steps = weights(model), [s["step"].item() for s in run.ctx.optimizer.state.values()]
    with pytest.warns(pf.NonFiniteLossWarning, match="global step 3 .*skipped.*1 non-finite loss"):
        run.step()
    assert same_weights(weights(model), before)
    assert [s["step"].item() for s in run.ctx.optimizer.state.values()] == adam_steps
    assert all(p.grad is None for p in model.parameters()) and run.ctx.scheduler.last_epoch == 2
    p = run.state.progress
    assert (p.global_step, p.iter_in_epoch, p.samples_seen) == (3, 3, 24)
    run()
    assert run.state.progress.global_step == 10 and run.ctx.scheduler.last_epoch == 9
    assert all(torch.isfinite(v).all() for v in weights(model).values())


def test_warn_warns_and_goes_on():
    """Under 'warn' the NaN step runs as usual and training continues."""
    model, run = _nan_run(3, training=pf.Training(on_nonfinite="warn"))
    with pytest.warns(pf.NonFiniteLossWarning) as said:  # NaN weights from then on: every later loss warns too
        run()
    assert "global step 3 " in _said(said, pf.NonFiniteLossWarning)
    assert "the step ran" in _said(said, pf.NonFiniteLossWarning)
    assert run.state.progress.global_step == 10


def test_a_custom_steps_nan_loss_is_checked_after_it_ran():
    """A custom step's reported NaN loss raises (its step already ran) or, under 'warn', warns, where it is read."""

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        return {"loss": model(batch)["loss"].detach()}

    _, run = _nan_run(2, (pf.log_every(1),), step_fn=step)
    with pytest.raises(pf.NonFiniteLossError, match="global step 2 "):
        run()
    _, run = _nan_run(2, (pf.log_every(1),), step_fn=step, training=pf.Training(on_nonfinite="warn"))
    with pytest.warns(pf.NonFiniteLossWarning, match="global step 2 .*the step ran"):
        run()


# -- model_best never from a non-finite evaluation ------------------------------------------------


def test_best_on_never_writes_model_best_from_an_infinite_or_nan_evaluation(tmp_path):
    """Evaluations inf, nan, -inf write no model_best; the first finite one after them does."""
    scores = iter([math.inf, math.nan, 0.5, -math.inf])

    def evaluator(model):
        score = next(scores)
        return {"score": score, "cost": score}  # one value, best as a max and as a min

    torch.manual_seed(0)
    model = TinyNet()
    hooks = [pf.evaluate_every(2, evaluator, name="val"), pf.best_on("score"), pf.best_on("cost", mode="min")]
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader("plain", 8),
        hooks=hooks,
        max_epochs=2,
        save_dir=tmp_path,
        watching=pf.Watching(console=False),
    )
    run.run(steps=4)
    assert not list((tmp_path / "model").glob("model_best*")) and dict(run.state.best) == {}
    run.run(steps=2)
    assert dict(run.state.best) == {"score": 0.5, "cost": 0.5}
    written = sorted(p.name for p in (tmp_path / "model").glob("model_best*.json"))
    run.run(steps=2)
    assert dict(run.state.best) == {"score": 0.5, "cost": 0.5}
    assert sorted(p.name for p in (tmp_path / "model").glob("model_best*.json")) == written
