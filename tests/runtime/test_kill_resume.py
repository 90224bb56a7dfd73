"""The gold test: a run killed with SIGKILL and resumed ends bit-identical to an uninterrupted one."""

import pathlib
import signal
import subprocess

import pytest
import torch

from _tiny_workload import same_weights
from _subprocess import run_workload

WORKLOAD = pathlib.Path(__file__).with_name("_tiny_workload.py")


def _run(*args) -> subprocess.CompletedProcess:
    return run_workload(WORKLOAD, *args)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Final weights and trace of runs that were never interrupted, per loader kind."""
    results = {}
    for kind in ("plain", "stateful"):
        out = tmp_path_factory.mktemp(f"full-{kind}") / "final.pt"
        done = _run(out.parent / "run", "--kind", kind, "--out", out)
        assert done.returncode == 0, done.stderr
        results[kind] = torch.load(out, weights_only=True)
    return results


@pytest.mark.parametrize("kind,kill_at", [("plain", 4), ("plain", 11), ("stateful", 7), ("stateful", 13)])
def test_sigkilled_run_resumes_to_identical_weights_and_trace(tmp_path, uninterrupted, kind, kill_at):
    """SIGKILL after step k, then resume='auto': same final weights, and the same effects from the resume point."""
    killed = _run(tmp_path / "run", "--kind", kind, "--kill-at", kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = tmp_path / "final.pt"
    resumed = _run(tmp_path / "run", "--kind", kind, "--resume", "--out", out)
    assert resumed.returncode == 0, resumed.stderr
    result = torch.load(out, weights_only=True)
    expected = uninterrupted[kind]
    assert same_weights(result["weights"], expected["weights"])
    assert expected["trace"][-len(result["trace"]) :] == result["trace"]
