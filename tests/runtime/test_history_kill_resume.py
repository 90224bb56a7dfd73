"""History across a SIGKILL: the resumed run's history and log.jsonl equal an uninterrupted run's, no step twice."""

import json
import pathlib
import signal

from _subprocess import run_workload
from _tiny_workload import build

WORKLOAD = pathlib.Path(__file__).with_name("_tiny_workload.py")


def _log(save_dir) -> list:
    return [json.loads(line) for line in (save_dir / "log.jsonl").read_text().splitlines()]


def test_history_after_a_sigkill_and_resume_is_the_uninterrupted_history(tmp_path):
    """Killed after step 11 (last checkpoint: step 9, records logged at 10), resumed: history continuous and exact."""
    killed = run_workload(WORKLOAD, tmp_path / "run", "--kill-at", 11)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert max(r["step"] for r in _log(tmp_path / "run")) == 10  # a record past the checkpoint, to be dropped

    _, resumed = build(tmp_path / "run", resume="auto")
    assert resumed.state.progress.global_step == 9 and max(r["step"] for r in resumed.history.records()) <= 9
    resumed()
    _, whole = build(tmp_path / "whole")
    whole()

    steps = [(r["step"], r["kind"]) for r in resumed.history.records()]
    assert len(steps) == len(set(steps)) and steps == sorted(steps, key=lambda s: s[0])
    assert resumed.history.records() == whole.history.records()
    assert _log(tmp_path / "run") == _log(tmp_path / "whole")
