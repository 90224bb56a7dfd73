"""SIGKILLed and resumed: two optimizers, an EMA and extra state come back bit-identical, sync and async saves."""

import pathlib
import signal
import subprocess

import pytest
import torch

from _tiny_workload import same
from _subprocess import run_workload

WORKLOAD = pathlib.Path(__file__).with_name("_more_state_workload.py")


def _run(*args) -> subprocess.CompletedProcess:
    return run_workload(WORKLOAD, *args)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """What runs that were never interrupted end with, with sync and with async saves."""
    results = {}
    for async_save in (False, True):
        out = tmp_path_factory.mktemp("full") / "final.pt"
        done = _run(out.parent / "run", "--out", out, *(["--async-save"] if async_save else []))
        assert done.returncode == 0, done.stderr
        results[async_save] = torch.load(out, weights_only=True)
    return results


@pytest.mark.parametrize("kill_at,async_save", [(4, False), (11, True)], ids=["4-sync", "11-async"])
def test_sigkilled_gan_with_ema_and_extra_state_resumes_exactly(tmp_path, uninterrupted, async_save, kill_at):
    """Killed after step k and resumed: same weights, both optimizers, EMA, extra state, and trace from k on."""
    flags = ["--async-save"] if async_save else []
    killed = _run(tmp_path / "run", "--kill-at", kill_at, *flags)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = tmp_path / "final.pt"
    resumed = _run(tmp_path / "run", "--resume", "--out", out, *flags)
    assert resumed.returncode == 0, resumed.stderr
    result = torch.load(out, weights_only=True)
    expected = uninterrupted[async_save]
    for part in ("weights", "optimizers", "ema", "stats"):
        assert same(result[part], expected[part]), part
    assert expected["trace"][-len(result["trace"]) :] == result["trace"]
