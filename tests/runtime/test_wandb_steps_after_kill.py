"""A W&B run killed outright (SIGKILL) and resumed holds every step once: the note of steps sent survives the kill."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import _wandb_kill_workload as workload
from test_tracker_resume import _wandb_points, _written

HERE = pathlib.Path(__file__).resolve().parent
TIMEOUT = 90


def _killed_in_step_6(save_dir: pathlib.Path) -> None:
    """Run the workload in a subprocess until it blocks in step 6 (steps 1-5 logged, step 3 saved), then SIGKILL it."""
    ready = save_dir.parent / "ready"
    # Its own W&B service: an inherited WANDB_SERVICE (this process's, from an earlier test) would outlive the kill
    # and keep holding the run's id.
    env = {
        **{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
        "WANDB_SILENT": "true",
        "WANDB_MODE": "offline",
    }
    with open(save_dir.parent / "workload.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, str(HERE / "_wandb_kill_workload.py"), str(save_dir), str(ready)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + TIMEOUT
            while not ready.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the workload never reached step 6: {(save_dir.parent / 'workload.log').read_text()}")
                time.sleep(0.05)
            time.sleep(0.5)  # W&B's own process takes what was logged
            process.send_signal(signal.SIGKILL)
        finally:
            process.kill()
            process.wait(timeout=TIMEOUT)


def test_a_run_killed_outright_and_resumed_sends_each_step_to_wandb_once(tmp_path, monkeypatch):
    """Killed in step 6 after logging 1-5 (saved at 3), resumed from 3: W&B holds train/loss at 1..10, each once."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    save_dir = tmp_path / "run"
    _killed_in_step_6(save_dir)
    _, resumed = workload.build(save_dir, resume="auto")
    assert resumed.state.progress.global_step == 3
    resumed()
    # The resumed process's file: its folder was made after the killed one's (names hold only the second).
    _written(max(save_dir.glob("wandb/offline-run-*/run-*.wandb"), key=lambda path: path.parent.stat().st_mtime))
    ids, points = _wandb_points(save_dir)
    assert len(ids) == 1 and len(list(save_dir.glob("wandb/offline-run-*"))) == 2
    assert [step for step, _ in points["train/loss"]] == list(range(1, 11))
