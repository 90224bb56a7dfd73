"""Control effects in real runs: early stopping, and the scheduler stepped by hooks."""

import types

import pytest
import torch

import pimm_fn as pf
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Log, SaveCheckpoint, Scope, StepScheduler, Stop
from pimm_fn.runtime.handlers import control
from pimm_fn.testing import simulate
from pimm_fn.testing.assertions import matches_plan
from _tiny_workload import TinyNet, loader, same_weights, weights

ITERS = 5  # the tiny loader: 40 samples in batches of 8


class Scripted:
    """An evaluator publishing the next of ``scores`` at each call, so its value at each evaluation step is known."""

    def __init__(self, scores):
        self.scores = list(scores)
        self.calls = 0

    def __call__(self, model):
        value = self.scores[self.calls]
        self.calls += 1
        return {"score": value}


def make(save_dir, hooks, *, scheduler=None, max_epochs=4, resume=None, step_fn=None):
    """A fresh model, SGD optimizer, optional scheduler (a factory of the optimizer) and loop, seeded alike."""
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = pf.loop(
        model,
        optimizer,
        loader(),
        hooks=hooks,
        max_epochs=max_epochs,
        save_dir=save_dir,
        scheduler=scheduler(optimizer) if scheduler else None,
        resume=resume,
        step_fn=step_fn,
        saving=pf.Saving(checkpoint_format="legacy"),
        watching=pf.Watching(console=False),
    )
    return model, run


def moments(entries) -> list:
    """(step, event type, effect, hook) of each entry: a trace without the steps' rank-local outputs."""
    return [(e.step, type(e.event), e.effect, e.hook) for e in entries]


# -- early stopping ----------------------------------------------------------------------------------


SCORES = {2: 0.1, 4: 0.2, 6: 0.3, 8: 0.3, 10: 0.25, 12: 0.2, 14: 0.1, 16: 0.5, 18: 0.6, 20: 0.7}


def stop_stack(save_n=5):
    evaluator = Scripted(SCORES[s] for s in sorted(SCORES))
    return [pf.evaluate_every(2, evaluator, name="val"), pf.early_stop("score", patience=3), pf.save_every(save_n)]


def test_early_stop_ends_a_real_run_where_plan_and_simulation_end(tmp_path):
    """Stopped at step 12 (mid-epoch): the real trace equals the plan and each simulated rank's collective trace."""
    hooks = stop_stack()
    _, run = make(tmp_path, hooks)
    calls = 0
    while not run.finished:
        run.step()
        calls += 1
    assert calls == 12  # the step() that trained step 12 also closed the epoch and the run
    planned = pf.plan(hooks, iters_per_epoch=ITERS, max_epochs=4, metrics={s: {"score": v} for s, v in SCORES.items()})
    assert moments(run.trace) == moments(planned)
    assert run.trace[-1].effect == SaveCheckpoint(12, final=True)  # the last step was not saved: the final save
    simulated = simulate(
        hooks, world_size=2, iters_per_epoch=ITERS, max_epochs=4, metrics={s: {"score": v} for s, v in SCORES.items()}
    )
    real_collective = [e for e in run.trace if e.effect.scope is Scope.COLLECTIVE]
    for rank in range(2):
        assert moments(simulated.collective(rank)) == moments(real_collective)
        assert simulated.states[rank].stop == run.state.stop
    p = run.state.progress
    assert (p.global_step, p.epoch, p.iter_in_epoch, run.state.position) == (12, 2, 2, "AfterTrain")
    assert run.state.stop.startswith("early_stop('score', patience=3): score has not improved on 0.3")


def test_the_console_says_the_evaluation_before_the_best_write_and_the_stop_it_causes(tmp_path, capsys):
    """log_every listed last: step 6's lines are its record, the evaluation, the new best, the stop, in the plan's order."""
    scores = [0.1, 0.15, 0.18]  # each a new best; none beats the one before by early_stop's min_delta
    hooks = [
        pf.evaluate_every(2, Scripted(scores), name="val"),
        pf.best_on("score"),
        pf.early_stop("score", patience=2, min_delta=0.1),
        pf.log_every(2),
    ]
    torch.manual_seed(0)
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader(),
        hooks=hooks,
        max_epochs=4,
        save_dir=tmp_path,
        watching=pf.Watching(progress=False),
    )
    run()
    said = [
        line.removeprefix("[pimm_fn] ").split(":")[0]
        for line in capsys.readouterr().out.splitlines()
        if "step 6" in line
    ]
    assert said == [
        "step 6 train",
        "step 6 eval/val",
        "new best score=0.18 at step 6",
        "stopping early at step 6",
        "step 6 epoch",
    ]
    planned = pf.plan(
        hooks, iters_per_epoch=ITERS, max_epochs=4, metrics={2: {"score": 0.1}, 4: {"score": 0.15}, 6: {"score": 0.18}}
    )
    assert matches_plan(run.trace, hooks, iters_per_epoch=ITERS, max_epochs=4)
    assert [type(e.effect).__name__ for e in planned if e.step == 6][:5] == [
        "Log",
        "Evaluate",
        "Log",
        "WriteBest",
        "Stop",
    ]


def test_run_returns_at_the_stop_and_a_second_run_does_nothing(tmp_path):
    """run() ends at the stop; run() again finds the run finished and trains nothing."""
    _, run = make(tmp_path, stop_stack())
    state = run.run()
    assert state.finished and state.progress.global_step == 12
    assert run.run() is run.state and run.state.progress.global_step == 12


def test_resume_from_the_stopping_steps_checkpoint_only_closes_the_run(tmp_path):
    """A checkpoint written at the stopping step (before the epoch closed) resumes into the closing events only."""
    model, run = make(tmp_path, stop_stack(save_n=6))  # saves at 6 and 12: 12 holds the stop, mid-epoch
    run()
    saves = [e.effect for e in run.trace if isinstance(e.effect, SaveCheckpoint)]
    assert saves == [SaveCheckpoint(6), SaveCheckpoint(12)]
    resumed_model, resumed = make(tmp_path, stop_stack(save_n=6), resume="auto")
    assert resumed.state.stop == run.state.stop and resumed.state.position == "AfterStep"
    resumed.step()
    assert resumed.finished and resumed.state.progress.global_step == 12
    assert resumed.trace == []  # AfterEpoch and AfterTrain run; nothing trains, nothing is saved again
    assert same_weights(weights(resumed_model), weights(model))


def test_a_saver_standing_before_the_stopper_records_the_stop(tmp_path):
    """save_every first: its save at the stopping step runs after the Stop, so a resume finds the run stopped, not
    a run to train on to max_epochs."""
    hooks = lambda: [pf.save_every(6), *stop_stack(save_n=1000)]
    model, run = make(tmp_path, hooks())
    run()
    assert run.state.stop is not None and run.state.progress.global_step == 12
    at_12 = [type(e.effect).__name__ for e in run.trace if e.step == 12]
    assert at_12[:3] == ["Evaluate", "Stop", "SaveCheckpoint"]  # then the final save, of the same step
    resumed_model, resumed = make(tmp_path, hooks(), resume="auto")
    assert resumed.state.stop == run.state.stop
    resumed()
    assert resumed.finished and resumed.state.progress.global_step == 12
    assert same_weights(weights(resumed_model), weights(model))


def test_stop_handler_answers_with_stop_requested():
    """The runtime's Stop handler says why and answers StopRequested, as plan's executor does."""
    said = []
    ctx = types.SimpleNamespace(say=said.append)
    assert control.stop(Stop(7, "plateau"), None, ctx) == (ev.StopRequested(7, "plateau"),)
    assert said == ["stopping early at step 7: plateau"]


# -- the scheduler stepped by hooks ----------------------------------------------------------------


def logged_lrs(run) -> list:
    return [e.effect.values["lr"] for e in run.trace if isinstance(e.effect, Log) and e.effect.kind == "train"]


def test_reduce_lr_on_plateau_reduces_the_lr_on_a_plateau_of_the_published_metric():
    """ReduceLROnPlateau(patience=1) halves the LR after the second evaluation without improvement."""
    scores = Scripted([0.1, 0.2, 0.2, 0.2, 0.3])  # evaluations at steps 2, 4, 6, 8, 10
    hooks = [pf.evaluate_every(2, scores, name="val"), pf.step_scheduler(on="score"), pf.log_every(1)]
    plateau = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=1)
    _, run = make(None, hooks, scheduler=plateau, max_epochs=2)
    run()
    assert logged_lrs(run) == [0.1] * 8 + [0.05] * 2
    assert [e.effect for e in run.trace if isinstance(e.effect, StepScheduler)] == [
        StepScheduler(s, "score", v) for s, v in [(2, 0.1), (4, 0.2), (6, 0.2), (8, 0.2), (10, 0.3)]
    ]


def _hand_written(epochs):
    """The same training written out by hand: StepLR stepped once per epoch, after the epoch's last step."""
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    data, lrs = loader(), []
    for _ in range(epochs):
        for batch in data:
            optimizer.zero_grad(set_to_none=True)
            model(batch)["loss"].backward()
            optimizer.step()
            lrs.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    return weights(model), lrs


def step_lr(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def test_per_epoch_step_lr_gives_the_lrs_and_weights_of_a_hand_written_loop():
    """step_scheduler('epoch') with StepLR: the same LR at every step, and the same weights, as by hand."""
    model, run = make(None, [pf.step_scheduler("epoch"), pf.log_every(1)], scheduler=step_lr, max_epochs=3)
    run()
    expected_weights, expected_lrs = _hand_written(3)
    assert logged_lrs(run) == expected_lrs == [0.1] * 5 + [0.05] * 5 + [0.025] * 5
    assert same_weights(weights(model), expected_weights)


def test_default_step_leaves_the_scheduler_to_a_hook_that_steps_it():
    """With a scheduler-stepping hook the step function is handed scheduler=None; without one, the scheduler."""
    given = []

    def recording_step(model, optimizer, batch, *, scheduler, scaler):
        given.append(scheduler)
        return pf.train_step(model, optimizer, batch, scheduler=scheduler, scaler=scaler)

    _, run = make(None, [pf.step_scheduler("epoch")], scheduler=step_lr, max_epochs=1, step_fn=recording_step)
    run()
    assert given == [None] * ITERS and run.ctx.scheduler.last_epoch == 1  # once, by the hook
    _, run = make(None, [pf.step_scheduler("epoch")], scheduler=step_lr, max_epochs=1)
    run()
    assert run.ctx.scheduler.last_epoch == 1  # the default step did not step it too
    given.clear()
    _, run = make(None, [], scheduler=step_lr, max_epochs=1, step_fn=recording_step)
    run()
    assert given == [run.ctx.scheduler] * ITERS and run.ctx.scheduler.last_epoch == ITERS


def test_a_scheduler_stepping_hook_without_a_scheduler_is_refused():
    """loop() refuses step_scheduler(...) with scheduler=None at construction, naming the hook and the fix."""
    with pytest.raises(
        ValueError,
        match=r"step_scheduler\('epoch'\) step the learning-rate scheduler, but "
        r"scheduler is None: pass scheduler=\.\.\. to loop\(\)",
    ):
        make(None, [pf.step_scheduler("epoch")])


def test_a_per_step_scheduler_hook_behind_a_saver_resumes_bit_identically(tmp_path):
    """The save at step 8 runs after that step's scheduler step, though its hook stands first: the resume does not lag."""
    hooks = lambda: [pf.save_every(4), pf.step_scheduler("step")]
    model, full = make(tmp_path / "full", hooks(), scheduler=step_lr, max_epochs=3)
    full()
    _, first = make(tmp_path / "cut", hooks(), scheduler=step_lr, max_epochs=3)
    first.run(steps=9)
    resumed_model, resumed = make(tmp_path / "cut", hooks(), scheduler=step_lr, max_epochs=3, resume="auto")
    assert resumed.state.progress.global_step == 8 and resumed.ctx.scheduler.last_epoch == 8
    resumed()
    assert same_weights(weights(resumed_model), weights(model))
    assert resumed.ctx.scheduler.state_dict() == full.ctx.scheduler.state_dict()


def test_handler_refuses_a_scheduler_of_the_other_kind():
    """A metric for a count-stepped scheduler, or none for ReduceLROnPlateau, is a clear error, not a silent misstep."""
    optimizer = torch.optim.SGD(TinyNet().parameters(), lr=0.1)
    counted = types.SimpleNamespace(scheduler=step_lr(optimizer))
    with pytest.raises(ValueError, match=r"StepLR steps by count, not on a metric, .* step_scheduler\('epoch'\)"):
        control.step_scheduler(StepScheduler(4, "loss", 0.5), None, counted)
    plateau = types.SimpleNamespace(scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer))
    needs_metric = r"ReduceLROnPlateau steps on a metric's value, .*step_scheduler\(on='<metric>'\)"
    with pytest.raises(ValueError, match=needs_metric):
        control.step_scheduler(StepScheduler(4), None, plateau)
    with pytest.raises(ValueError, match="this run has none: pass scheduler= to loop"):
        control.step_scheduler(StepScheduler(4), None, types.SimpleNamespace(scheduler=None))


@pytest.mark.parametrize("cut", [9, 13])
def test_resume_with_per_epoch_scheduler_stepping_is_bit_identical(tmp_path, cut):
    """Cut after step 9 or 13, resumed from the save at 8 or 12: the uninterrupted run's weights, scheduler, trace."""
    hooks = lambda: [pf.step_scheduler("epoch"), pf.save_every(4)]
    model, full = make(tmp_path / "full", hooks(), scheduler=step_lr, max_epochs=3)
    full()
    _, first = make(tmp_path / "cut", hooks(), scheduler=step_lr, max_epochs=3)
    first.run(steps=cut)
    resumed_model, resumed = make(tmp_path / "cut", hooks(), scheduler=step_lr, max_epochs=3, resume="auto")
    start = resumed.state.progress.global_step
    assert start == cut - 1 and resumed.ctx.scheduler.last_epoch == start // ITERS
    resumed()
    assert same_weights(weights(resumed_model), weights(model))
    assert resumed.ctx.scheduler.state_dict() == full.ctx.scheduler.state_dict()
    assert [e.effect for e in resumed.trace] == [e.effect for e in full.trace if e.step > start]
