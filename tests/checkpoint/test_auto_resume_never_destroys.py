"""resume='auto' never starts fresh over checkpoints it rejected; it starts fresh, saying so, only where there are none.

One tiny run is saved once (``last/`` and ``iter_4``, ``iter_8``, ``iter_10``);
each case copies it and damages the copy. The two-rank version is
``tests/distributed/test_auto_resume_rejected_ranks.py``.
"""

import pathlib
import shutil
import sys
import threading
import time

import pytest

import pimm_fn as pf
from pimm_fn.checkpoint import discovery as choice

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402
from _disk_faults import damage, hashes  # noqa: E402


hooks = tw.snapshotting


def resumed(run_dir, fmt="standard"):
    return tw.build(
        run_dir, hooks=hooks(), max_epochs=3, resume="auto", fmt=fmt, console=True, watching=pf.Watching(progress=False)
    )


def only_last(finished_runs, tmp_path) -> pathlib.Path:
    """A copy of the standard run holding ``last/`` alone (no snapshot to fall back to)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_runs / "standard", run_dir)
    for snapshot in (run_dir / "model").glob("iter_*"):
        shutil.rmtree(snapshot)
    return run_dir


def test_a_lost_marker_on_the_only_checkpoint_is_refused_not_replaced(finished_runs, tmp_path):
    """last/ without its COMPLETE raises CheckpointError naming it and the fix; nothing under save_dir changes."""
    run_dir = only_last(finished_runs, tmp_path)
    (run_dir / "model" / "last" / "COMPLETE").unlink()
    before = hashes(run_dir)
    with pytest.raises(pf.CheckpointError) as caught:
        resumed(run_dir)
    message = str(caught.value)
    assert isinstance(caught.value, choice.NoIntactCheckpointError)
    assert f"{run_dir / 'model' / 'last'} (step unknown): COMPLETE is missing" in message, message
    assert "Repair one" in message and "move them aside" in message and "resume=None" in message, message
    assert hashes(run_dir) == before and sorted(p.name for p in run_dir.iterdir()) == ["log.jsonl", "model"]


def test_every_legacy_checkpoint_damaged_is_refused_not_replaced(finished_runs, tmp_path):
    """The legacy format alike: every file overwritten, 'auto' raises naming each, and every byte stays."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_runs / "legacy", run_dir)
    names = sorted(p.name for p in (run_dir / "model").iterdir() if p.suffix == ".pth" and "best" not in p.name)
    assert names == ["iter_10.pth", "iter_4.pth", "iter_8.pth", "last.pth"]
    for name in names:
        damage(run_dir / "model" / name, "garbage")
    before = hashes(run_dir)
    with pytest.raises(pf.CheckpointError) as caught:
        resumed(run_dir, fmt="legacy")
    assert sorted(pathlib.Path(r[0]).name for r in caught.value.rejected) == names
    assert hashes(run_dir) == before


def test_a_file_missing_briefly_is_found_on_a_second_look(finished_runs, tmp_path, capsys):
    """A weights file that shows up 0.3 s late (a slow NFS mount) is waited for: the run resumes at step 10."""
    run_dir = only_last(finished_runs, tmp_path)
    weights = run_dir / "model" / "last" / "model.pth"
    away = tmp_path / "model.pth.elsewhere"
    weights.rename(away)
    timer = threading.Timer(0.3, away.rename, args=(weights,))
    timer.start()
    try:
        _, run = resumed(run_dir)
    finally:
        timer.join()
    assert run.state.progress.global_step == 10
    assert "skipped checkpoint" not in capsys.readouterr().out


def test_a_file_missing_for_good_is_looked_for_about_a_second_then_refused(finished_runs, tmp_path):
    """The second look is bounded: a file that never comes back is refused after about sum(RECHECK_S) seconds."""
    run_dir = only_last(finished_runs, tmp_path)
    (run_dir / "model" / "last" / "model.pth").unlink()
    start = time.monotonic()
    with pytest.raises(pf.CheckpointError, match="model.pth is missing"):
        choice.newest_readable(run_dir / "model", say=lambda line: None)
    waited = time.monotonic() - start
    assert sum(choice.RECHECK_S) <= waited < sum(choice.RECHECK_S) + 3, waited


def test_a_mistyped_save_dir_says_there_is_no_checkpoint_and_starts_fresh(tmp_path, capsys):
    """resume='auto' into a save_dir with nothing in it says 'no checkpoint in <dir>: starting fresh'."""
    _, run = resumed(tmp_path / "runs" / "exp1-typo")
    assert run.state.progress.global_step == 0
    out = capsys.readouterr().out
    assert f"no checkpoint in {tmp_path / 'runs' / 'exp1-typo' / 'model'}: starting fresh" in out, out


def test_best_weights_and_staging_alone_are_no_checkpoint(finished_runs, tmp_path, capsys):
    """model_best and a .staging-* directory are not published checkpoints: 'auto' starts fresh, saying so."""
    run_dir = tmp_path / "run"
    (run_dir / "model" / ".staging-last-12").mkdir(parents=True)
    shutil.copy(finished_runs / "standard" / "model" / "last" / "model.pth", run_dir / "model" / "model_best.pth")
    with pytest.warns(pf.ConfigurationWarning, match="model_best.pth"):
        _, run = resumed(run_dir)
    assert run.state.progress.global_step == 0
    assert f"no checkpoint in {run_dir / 'model'}: starting fresh" in capsys.readouterr().out


def test_the_refusal_pickles_with_everything_it_names():
    """NoIntactCheckpointError crosses processes unchanged and is a CheckpointError (a ValueError)."""
    import pickle

    error = choice.NoIntactCheckpointError("runs/x/model", (("runs/x/model/last", "step 4", "COMPLETE", "is missing"),))
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, pf.CheckpointError) and isinstance(again, ValueError)
    assert (again.path, again.file, again.problem, again.rejected, str(again)) == (
        error.path,
        error.file,
        error.problem,
        error.rejected,
        str(error),
    )
