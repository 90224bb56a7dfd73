"""Resume: a run continued from any checkpoint ends exactly like the uninterrupted one."""

import pytest
import torch

import pimm_fn as pf
from _tiny_workload import build, same_weights, weights


def _uninterrupted(tmp_path, kind, **kwargs):
    model, run = build(tmp_path / "full", kind=kind, **kwargs)
    run()
    return weights(model), run


@pytest.mark.parametrize("kind", ["plain", "stateful", "generator"])
@pytest.mark.parametrize("stop", [4, 5, 7, 11, 15])
def test_resumed_run_ends_bit_identical_to_uninterrupted(tmp_path, kind, stop):
    """Stopping after any step and resuming from the latest checkpoint gives the same weights and trace."""
    expected, full = _uninterrupted(tmp_path, kind)
    _, first = build(tmp_path / "cut", kind=kind)
    first.run(steps=stop)
    model, resumed = build(tmp_path / "cut", kind=kind, resume="auto")
    start = resumed.state.progress.global_step
    assert 0 < start <= stop
    resumed()
    assert same_weights(weights(model), expected)
    assert [e.effect for e in resumed.trace] == [e.effect for e in full.trace if e.step > start]


def test_resume_restores_progress_slots_best_and_optimizer(tmp_path):
    """The resumed state equals the state the checkpoint recorded, best values and hook slots included."""
    _, first = build(tmp_path, max_epochs=2)
    first.run(steps=6)  # saves at 3 and 6; evaluation at 4 set a best value
    saved_state = first.state
    _, resumed = build(tmp_path, resume="auto", max_epochs=2)
    assert resumed.state.progress == saved_state.progress
    assert resumed.state.best == saved_state.best and "score" in resumed.state.best
    assert resumed.state.slots == saved_state.slots
    assert resumed.ctx.optimizer.state_dict()["state"].keys() == first.ctx.optimizer.state_dict()["state"].keys()
    assert resumed.ctx.scheduler.last_epoch == 6


def test_resume_auto_without_checkpoint_starts_fresh(tmp_path):
    """resume='auto' in an empty save_dir is a fresh start."""
    _, run = build(tmp_path, resume="auto")
    assert run.state.progress.global_step == 0 and run.state.position is None


def test_fresh_start_refuses_a_save_dir_with_checkpoints(tmp_path):
    """Starting fresh where checkpoints exist raises instead of overwriting them."""
    _, run = build(tmp_path, max_epochs=1)
    run()
    before = sorted(p.name for p in (tmp_path / "model").iterdir())
    with pytest.raises(FileExistsError, match="resume='auto'"):
        build(tmp_path, max_epochs=1)
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == before


def test_resuming_a_finished_run_runs_nothing_and_writes_nothing(tmp_path, capsys):
    """A finished run resumed with the same max_epochs trains no step, writes no file and says so once."""
    _, run = build(tmp_path, max_epochs=2)
    run()
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.warns(pf.ConfigurationWarning) as said:
        model, resumed = build(tmp_path, resume="auto", max_epochs=2, console=True)
    before = weights(model)
    state = resumed()
    assert state.progress.global_step == 10 and resumed.trace == []
    assert same_weights(weights(model), before)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files
    out = capsys.readouterr().out
    assert [str(w.message) for w in said if "nothing is left to train" in str(w.message)] and "nothing to do" not in out
    assert "already finished at step 10: nothing to do" in _said_by(resumed, capsys)  # a second run() says it


def _said_by(run, capsys) -> str:
    """What ``run()`` says on the console."""
    run()
    return capsys.readouterr().out


def test_finished_run_whose_last_save_was_the_deferred_epoch_end_one_also_does_nothing(tmp_path, capsys):
    """When the final step's save was deferred to AfterEpoch, a resume still trains and writes nothing, and says so."""
    hooks = [pf.save_every(5), pf.log_every(100)]  # step 15 ends epoch 2: its save is the deferred one
    _, run = build(tmp_path, hooks=hooks, max_epochs=3)
    run()
    assert [e.effect.deferred for e in run.trace if isinstance(e.effect, pf.effects.SaveCheckpoint)][-1]
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.warns(pf.ConfigurationWarning, match="nothing is left to train"):
        model, resumed = build(tmp_path, hooks=hooks, resume="auto", max_epochs=3, console=True)
    before = weights(model)
    state = resumed()
    assert state.finished and state.progress.global_step == 15 and resumed.trace == []
    assert same_weights(weights(model), before)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files
    assert "nothing to do" not in capsys.readouterr().out  # loop() said it: once


def test_resuming_a_finished_run_with_more_epochs_continues(tmp_path):
    """A larger max_epochs carries a finished run on to the new end, as if it had been asked for at first."""
    expected, _ = _uninterrupted(tmp_path, "plain", max_epochs=4)
    _, run = build(tmp_path / "cut", max_epochs=2)
    run()
    model, more = build(tmp_path / "cut", resume="auto", max_epochs=4)
    state = more()
    assert state.progress.global_step == 20 and state.progress.epoch == 3
    saves = [e.effect.step for e in more.trace if isinstance(e.effect, pf.effects.SaveCheckpoint)]
    assert saves == [12, 15, 18, 20]


def test_fewer_epochs_than_already_trained_is_refused(tmp_path):
    """Resuming with max_epochs below the trained epochs is a clear error."""
    _, run = build(tmp_path, max_epochs=3)
    run()
    with pytest.raises(ValueError, match="max_epochs=1 is below the 3 epoch"):
        build(tmp_path, resume="auto", max_epochs=1)


def test_resume_from_an_explicit_checkpoint_path(tmp_path):
    """resume=<path> resumes from that checkpoint, not the latest one."""
    hooks = [pf.save_every(2, snapshots=True)]
    _, run = build(tmp_path, hooks=hooks, max_epochs=2)
    run()
    _, resumed = build(tmp_path, hooks=hooks, max_epochs=2, resume=tmp_path / "model" / "iter_4")
    assert resumed.state.progress.global_step == 4


def test_resume_with_fewer_hooks_gives_each_remaining_hook_its_own_slot(tmp_path):
    """Slots are matched by hook identity, so a shorter hook list resumes and save_every keeps its slot."""
    _, run = build(tmp_path, max_epochs=1)
    run()
    saved = dict(zip(map(repr, run.hooks.hooks), run.state.slots))["save_every(3)"]
    _, resumed = build(tmp_path, resume="auto", max_epochs=2, hooks=[pf.save_every(3)])
    assert resumed.state.slots == (saved,) and resumed.state.progress.global_step == 5


@pytest.mark.parametrize("stop", [3, 7])
def test_legacy_format_resumes_bit_identical(tmp_path, stop):
    """The one-file legacy format restores everything the standard one does."""
    expected, _ = _uninterrupted(tmp_path, "plain", fmt="legacy")
    assert (tmp_path / "full" / "model" / "last.pth").is_file()
    _, first = build(tmp_path / "cut", fmt="legacy")
    first.run(steps=stop)
    model, resumed = build(tmp_path / "cut", fmt="legacy", resume="auto")
    resumed()
    assert same_weights(weights(model), expected)


def test_a_one_shot_iterator_warns_that_resume_is_not_exact(tmp_path):
    """Data that cannot be rewound resumes with a ResumeNotExactWarning."""
    torch.manual_seed(0)
    from _tiny_workload import TinyNet, dataset
    from torch.utils.data import DataLoader

    def make(resume):
        model = TinyNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        data = iter(list(DataLoader(dataset(), batch_size=8)) * 3)
        return pf.loop(
            model,
            optimizer,
            data,
            hooks=[pf.save_every(2)],
            max_epochs=3,
            training=pf.Training(iters_per_epoch=5),
            save_dir=tmp_path,
            resume=resume,
            watching=pf.Watching(console=False),
        )

    make(None).run(steps=3)
    with pytest.warns(pf.ResumeNotExactWarning, match="cannot restore the data position"):
        make("auto")


def test_a_capped_stateful_loader_warns_that_an_epoch_end_resume_is_not_exact(tmp_path):
    """With iters_per_epoch below the loader's length, the loader's pass never finishes: resuming says so."""
    with pytest.warns(pf.ResumeNotExactWarning, match="Leave iters_per_epoch at len"):
        capped = pf.Training(iters_per_epoch=3)
        _, first = build(tmp_path, kind="stateful", hooks=[pf.save_every(3)], training=capped, max_epochs=2)
        first.run(steps=3)
        build(tmp_path, kind="stateful", hooks=[pf.save_every(3)], training=capped, max_epochs=2, resume="auto")
