"""The pure core's annotations, checked strictly by mypy (configured in pyproject.toml)."""

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_core_is_clean_under_strict_mypy(tmp_path):
    """`mypy pimm_fn/core` with the project's configuration reports no error."""
    api = pytest.importorskip("mypy.api", reason="mypy is not installed: `scripts/setup.sh test` installs it")
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "mypy_cache"),  # nothing written into the checkout
            "--no-error-summary",
            str(REPO / "pimm_fn" / "core"),
        ]
    )
    assert status == 0, f"mypy found type errors in pimm_fn/core (exit {status}):\n{stdout}{stderr}"
