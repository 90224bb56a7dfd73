"""loop(max_steps=N): a real run ends at global step N, resumes exactly, and extends with a larger budget."""

import pathlib
import signal
import subprocess

import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint import latest_checkpoint
from pimm_fn.core.effects import Evaluate, SaveCheckpoint
from pimm_fn.testing.assertions import moments, published_metrics
from _tiny_workload import TinyNet, build, loader, same_weights, standard_hooks, weights
from _subprocess import run_workload

WORKLOAD = pathlib.Path(__file__).with_name("_max_steps_workload.py")
BUDGET = 12  # 5 steps per epoch: epochs 0 and 1 whole, epoch 2 cut after its second step


def _loud(save_dir, *, batch_size=8, resume="auto", **budget):
    """The tiny workload's loop with ``budget``, its console on: what it says at construction is captured."""
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.9)
    run = pf.loop(
        model,
        optimizer,
        loader("stateful", batch_size),
        hooks=standard_hooks(),
        save_dir=save_dir,
        scheduler=scheduler,
        resume=resume,
        **budget,
    )
    return model, run


def test_a_run_with_max_steps_ends_at_that_step_with_its_final_checkpoint(tmp_path):
    """Training stops after global step 12, mid-epoch; the cut epoch closes and the last checkpoint is step 12."""
    _, run = build(tmp_path, max_epochs=None, max_steps=BUDGET)
    state = run()
    p = state.progress
    assert state.finished and (p.global_step, p.epoch, p.iter_in_epoch, p.step_limit) == (BUDGET, 2, 2, BUDGET)
    assert latest_checkpoint(tmp_path / "model").step == BUDGET
    last = run.trace[-1]
    assert isinstance(last.effect, SaveCheckpoint) and last.effect.step == BUDGET
    assert isinstance(last.event, pf.events.AfterEpoch) and last.effect.deferred  # after the cut epoch's hooks


def test_a_real_max_steps_run_executes_what_plan_predicts(tmp_path):
    """plan(max_steps=N) with the metrics the run published is the real run's trace."""
    _, run = build(tmp_path, max_epochs=None, max_steps=BUDGET)
    run()
    metrics = published_metrics(run.trace)
    assert set(metrics) == {e.effect.step for e in run.trace if isinstance(e.effect, Evaluate)} == {4, 8, 12}
    planned = pf.plan(standard_hooks(), iters_per_epoch=5, max_steps=BUDGET, metrics=metrics)
    assert moments(run.trace) == moments(planned)  # a Log by its step and kind: a dry run has no losses


@pytest.mark.parametrize("stop", [4, 7, 11])
def test_a_max_steps_run_stopped_and_resumed_ends_bit_identical(tmp_path, stop):
    """Stopped after any step and resumed with the same max_steps: same weights, same trace from the checkpoint on."""
    model, full = build(tmp_path / "full", kind="stateful", max_epochs=None, max_steps=BUDGET)
    full()
    _, first = build(tmp_path / "cut", kind="stateful", max_epochs=None, max_steps=BUDGET)
    first.run(steps=stop)
    resumed_model, resumed = build(tmp_path / "cut", kind="stateful", max_epochs=None, max_steps=BUDGET, resume="auto")
    start = resumed.state.progress.global_step
    resumed()
    assert resumed.state.progress.global_step == BUDGET
    assert same_weights(weights(resumed_model), weights(model))
    assert [e.effect for e in resumed.trace] == [e.effect for e in full.trace if e.step > start]


def test_a_larger_max_steps_extends_a_finished_run_and_says_so(tmp_path, capsys):
    """A run finished at step 7, resumed with max_steps=12, trains steps 8..12 from the next epoch and says so."""
    _, run = build(tmp_path, max_epochs=None, max_steps=7)
    run()
    _, extended = _loud(tmp_path, max_steps=BUDGET)
    assert "max_steps 7 -> max_steps 12: training goes on to step 12" in capsys.readouterr().out
    state = extended()
    p = state.progress
    assert state.finished and (p.global_step, p.epoch, p.iter_in_epoch) == (BUDGET, 2, 5)
    assert [e.step for e in extended.trace if isinstance(e.effect, SaveCheckpoint)] == [9, 12]
    assert latest_checkpoint(tmp_path / "model").step == BUDGET


def test_a_max_steps_already_passed_ends_at_once_and_says_so(tmp_path, capsys):
    """A run at step 12 resumed with max_steps=5 trains nothing, writes nothing, and says the budget was reached."""
    _, run = build(tmp_path, max_epochs=None, max_steps=BUDGET)
    run()
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    model, resumed = _loud(tmp_path, max_steps=5)
    before = weights(model)
    state = resumed()
    out = capsys.readouterr().out
    assert "max_steps=5 was already reached: this checkpoint is at step 12, so training ends at once" in out
    assert "training already finished" not in out  # loop() warned that nothing is left: not said again
    assert state.progress.global_step == BUDGET and resumed.trace == []
    assert same_weights(weights(model), before)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files


def test_max_steps_holds_when_a_resume_changes_the_epoch_length(tmp_path, capsys):
    """Stopped at step 7 with 5 steps per epoch, resumed with 10 (half the batch): training still ends at step 17."""
    _, first = _loud(tmp_path, resume=None, max_steps=17)
    first.run(steps=7)  # the checkpoint of step 6, mid-epoch 1
    with pytest.warns(pf.ResumeNotExactWarning):
        _, resumed = _loud(tmp_path, batch_size=4, max_steps=17)
    start = resumed.state.progress
    assert (start.global_step, start.iters_per_epoch) == (6, 10) and "-> max_steps" not in capsys.readouterr().out
    state = resumed()
    assert state.finished and state.progress.global_step == 17
    assert latest_checkpoint(tmp_path / "model").step == 17
    planned = pf.plan(standard_hooks(), iters_per_epoch=10, max_steps=17, start=start)
    saves = lambda trace: [e.effect.step for e in trace if isinstance(e.effect, SaveCheckpoint)]
    assert saves(resumed.trace) == saves(planned) and saves(planned)[-1] == 17


@pytest.mark.parametrize(
    "budget, error, message",
    [
        (dict(max_epochs=2, max_steps=5), TypeError, "loop: pass exactly one of max_epochs= .* got both"),
        (dict(max_epochs=None), TypeError, "loop: pass exactly one of max_epochs= .* got neither"),
        (dict(max_epochs=None, max_steps=0), ValueError, r"loop: 'max_steps' must be an int >= 1 \(got 0\)"),
        (dict(max_epochs=None, max_steps=2.5), TypeError, r"loop: 'max_steps' must be an int \(got 2.5\)"),
    ],
)
def test_loop_needs_exactly_one_valid_budget_at_construction(tmp_path, budget, error, message):
    """Both budgets, neither, or a max_steps that is not an int >= 1 is refused before anything is built."""
    with pytest.raises(error, match=message):
        build(tmp_path, **budget)
    assert not (tmp_path / "model").exists()


def _run(*args) -> subprocess.CompletedProcess:
    return run_workload(WORKLOAD, *args)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Final weights and trace of max_steps runs never interrupted, per loader kind."""
    results = {}
    for kind in ("plain", "stateful"):
        out = tmp_path_factory.mktemp(f"full-{kind}") / "final.pt"
        done = _run(out.parent / "run", "--max-steps", BUDGET, "--kind", kind, "--out", out)
        assert done.returncode == 0, done.stderr
        results[kind] = torch.load(out, weights_only=True)
    return results


@pytest.mark.parametrize("kind,kill_at", [("plain", 7), ("stateful", 11)])
def test_a_sigkilled_max_steps_run_resumes_to_identical_weights_and_trace(tmp_path, uninterrupted, kind, kill_at):
    """SIGKILL after step k, then resume='auto' with the same max_steps: same weights, same trace, ends at step N."""
    killed = _run(tmp_path / "run", "--max-steps", BUDGET, "--kind", kind, "--kill-at", kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = tmp_path / "final.pt"
    resumed = _run(tmp_path / "run", "--max-steps", BUDGET, "--kind", kind, "--resume", "--out", out)
    assert resumed.returncode == 0, resumed.stderr
    result, expected = torch.load(out, weights_only=True), uninterrupted[kind]
    assert result["step"] == expected["step"] == BUDGET
    assert same_weights(result["weights"], expected["weights"])
    assert expected["trace"][-len(result["trace"]) :] == result["trace"]
