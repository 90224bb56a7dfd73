"""Running a training workload script as a real subprocess, bounded by a timeout (the kill-and-resume tests)."""

import subprocess

import _preloaded as preloaded
import pytest

TIMEOUT = 120  # a hang fails the test instead of stalling the suite


def run_workload(workload, *args) -> subprocess.CompletedProcess:
    """``python <workload> <args>``, forked with torch imported (``_preloaded``), its output captured.

    A hang past ``TIMEOUT`` fails the test.
    """
    try:
        return preloaded.run([workload, *args], timeout=TIMEOUT)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"training subprocess hung for {TIMEOUT}s: {timeout.stderr}")
