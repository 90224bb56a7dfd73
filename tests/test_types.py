"""The package's annotations, checked by mypy: strictly in the pure core, in mypy's default mode elsewhere.

The configuration is pyproject.toml's ``[tool.mypy]``. mypy runs in a process of its own: run inside the
test worker it left about two million objects in reference cycles, and the worker's last garbage
collection then took 6 s, past the 5 s pytest-xdist's transport waits for a worker to finish before it
interrupts it (a ``KeyboardInterrupt`` inside whatever finalizer ran then).
"""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_package_is_clean_under_mypy(tmp_path):
    """`mypy pimm_fn` with the project's configuration reports no error."""
    pytest.importorskip("mypy", reason="mypy is not installed: `scripts/setup.sh test` installs it")
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "mypy_cache"),  # nothing written into the checkout
            "--no-error-summary",
            str(REPO / "pimm_fn"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert checked.returncode == 0, (
        f"mypy found type errors in pimm_fn (exit {checked.returncode}):\n{checked.stdout}{checked.stderr}"
    )
