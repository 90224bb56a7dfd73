"""``python -m pimm_fn status``: how a run ended, read from its checkpoints, on real runs that finished, were
preempted, stopped early or were killed, on a file system and on a store."""

import json
import pathlib
import signal
import subprocess
import sys
import uuid

import pytest

import pimm_fn as pf
from pimm_fn.cli import DAMAGED, FINISHED, MID_RUN, NOT_FOUND, TO_CONTINUE, main

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _preemption_workload as pw  # noqa: E402
import _tiny_workload as tw  # noqa: E402

TIMEOUT = 120


def _status(capsys, target) -> tuple[int, dict]:
    code = main(["status", str(target), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _preempted(save_dir, step: int = 4) -> pf.Preempted:
    model, run = tw.build(save_dir, hooks=[pf.save_every(3)], max_epochs=2)
    pw.signal_at_forward(model, step)
    with pytest.raises(pf.Preempted) as caught:
        run()
    return caught.value


def test_a_finished_run_is_0_and_a_script_gets_the_same_code(tmp_path, capsys):
    """A run trained to its end: status finished, exit 0, through a real `python -m pimm_fn status` too."""
    tw.finished(tmp_path / "run")
    code, found = _status(capsys, tmp_path / "run")
    assert (code, found["status"], found["step"], found["saved_for"]) == (FINISHED, "finished", 10, None)
    done = subprocess.run(
        [sys.executable, "-m", "pimm_fn", "status", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert (done.returncode, done.stderr) == (FINISHED, "") and done.stdout.startswith("finished: step 10 of 10"), done


def test_a_preempted_run_is_75_and_names_the_signal_then_0_once_resumed_to_the_end(tmp_path, capsys):
    """SIGTERM during step 4: status says to continue, exit 75, saved for SIGTERM; resumed to the end: 0."""
    assert _preempted(tmp_path / "run").step == 4
    code, found = _status(capsys, tmp_path / "run")
    assert (code, found["status"], found["step"], found["saved_for"]) == (TO_CONTINUE, "to continue", 4, "SIGTERM")
    _, run = tw.build(tmp_path / "run", hooks=[pf.save_every(3)], max_epochs=2, resume="auto")
    run()
    assert _status(capsys, tmp_path / "run")[0] == FINISHED


def test_a_killed_run_is_4_stopped_mid_run(tmp_path, capsys):
    """A script SIGKILLed at step 7 (saves every 3 steps): status stopped mid-run at step 6, exit 4."""
    killed = subprocess.run(
        [sys.executable, str(pathlib.Path(tw.__file__)), str(tmp_path / "run"), "--kill-at", "7"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert killed.returncode == -signal.SIGKILL, killed
    code, found = _status(capsys, tmp_path / "run")
    assert (code, found["status"], found["step"], found["saved_for"]) == (MID_RUN, "stopped mid-run", 6, None)
    assert main(["status", str(tmp_path / "run")]) == MID_RUN
    assert capsys.readouterr().out.startswith("stopped mid-run: its newest checkpoint is step 6 of 15")


def test_an_early_stop_is_finished(tmp_path, capsys):
    """early_stop ends training before its budget: finished (0), and the stop's reason said."""
    hooks = [pf.evaluate_every(1, lambda model: {"score": 1.0}), pf.early_stop("score", patience=1), pf.save_every(100)]
    _, run = tw.build(tmp_path / "run", hooks=hooks, max_epochs=2)
    run()
    code, found = _status(capsys, tmp_path / "run")
    assert (code, found["step"]) == (FINISHED, 2) and found["stop"], found
    assert main(["status", str(tmp_path / "run")]) == FINISHED and "stopped early" in capsys.readouterr().out


def test_no_checkpoint_is_3_and_checkpoints_none_of_which_reads_are_1(tmp_path, capsys):
    """A save_dir with no checkpoint: not found (3); its only checkpoint cut short: damaged (1), naming it."""
    (tmp_path / "empty" / "model").mkdir(parents=True)
    assert main(["status", str(tmp_path / "empty")]) == NOT_FOUND
    assert "the run never saved" in capsys.readouterr().err
    tw.finished(tmp_path / "run")
    for snapshot in (tmp_path / "run" / "model").glob("iter_*"):
        snapshot.rename(tmp_path / snapshot.name)  # only last is left
    weights = tmp_path / "run" / "model" / "last" / "model.pth"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["status", str(tmp_path / "run")]) == DAMAGED
    assert "no checkpoint under" in capsys.readouterr().err


def test_a_damaged_last_is_passed_over_for_the_snapshot_a_resume_takes(tmp_path, capsys):
    """last cut short beside iter_8: the status is iter_8's (mid-run, 4), and last is named as passed over."""
    tw.finished(tmp_path / "run")
    weights = tmp_path / "run" / "model" / "last" / "model.pth"
    weights.write_bytes(weights.read_bytes()[:100])
    (tmp_path / "run" / "model" / "iter_10").rename(tmp_path / "iter_10")  # the finished step's snapshot gone too
    code, found = _status(capsys, tmp_path / "run")
    assert (code, found["step"]) == (MID_RUN, 8) and [p["name"] for p in found["passed_over"]] == ["last"], found


def test_status_reads_a_run_on_a_store(capsys):
    """save_dir="memory://...": a preempted run is 75 from its committed last-<step>-<token>."""
    url = f"memory://pimm-{uuid.uuid4().hex[:12]}/run"
    stopped = _preempted(url, step=2)
    code, found = _status(capsys, url)
    assert (code, found["saved_for"], found["checkpoint"]) == (TO_CONTINUE, "SIGTERM", str(stopped.path)), found
