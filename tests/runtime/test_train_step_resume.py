"""A run with a configured TrainStep, killed with SIGKILL and resumed, ends bit-identical to an uninterrupted one."""

import pathlib
import signal
import subprocess

import pytest
import torch

from _tiny_workload import same_weights
from _subprocess import run_workload

WORKLOAD = pathlib.Path(__file__).with_name("_step_workload.py")

CONFIGS = {
    "accumulate": ("--accumulate", 3),  # 10 batches an epoch: 3 steps of 3, one batch left out
    "accumulate-stateful": ("--accumulate", 3, "--kind", "stateful"),
    "bf16-clip": ("--precision", "bf16", "--accumulate", 2, "--clip", 0.05),
    "supervised": ("--supervised", "--accumulate", 3, "--kind", "stateful", "--clip", 0.05),  # TrainStep(loss_fn=)
}


def _run(*args) -> subprocess.CompletedProcess:
    return run_workload(WORKLOAD, *args)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Final weights and trace of the never-interrupted run of a configuration, computed once each."""
    results = {}

    def get(config):
        if config not in results:
            out = tmp_path_factory.mktemp(f"full-{config}") / "final.pt"
            done = _run(out.parent / "run", *CONFIGS[config], "--out", out)
            assert done.returncode == 0, done.stderr
            results[config] = torch.load(out, weights_only=True)
        return results[config]

    return get


@pytest.mark.parametrize(
    "config,kill_at",
    [
        ("accumulate", 5),  # mid-epoch 1, one step after the checkpoint of step 4
        ("accumulate-stateful", 7),  # after the deferred checkpoint of the epoch-ending step 6
        ("bf16-clip", 9),
        ("supervised", 5),
    ],
)
def test_sigkilled_configured_step_resumes_to_identical_weights_and_trace(tmp_path, uninterrupted, config, kill_at):
    """SIGKILL after an optimizer step, then resume='auto': same final weights and the same effects from the resume."""
    killed = _run(tmp_path / "run", *CONFIGS[config], "--kill-at", kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = tmp_path / "final.pt"
    resumed = _run(tmp_path / "run", *CONFIGS[config], "--resume", "--out", out)
    assert resumed.returncode == 0, resumed.stderr
    result, expected = torch.load(out, weights_only=True), uninterrupted(config)
    assert result["steps"] == expected["steps"]
    assert same_weights(result["weights"], expected["weights"])
    assert expected["trace"][-len(result["trace"]) :] == result["trace"]
