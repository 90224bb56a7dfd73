"""The package's annotations, checked by mypy: strictly in the pure core, in mypy's default mode elsewhere.

The configuration is pyproject.toml's ``[tool.mypy]``.
"""

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_package_is_clean_under_mypy(tmp_path):
    """`mypy pimm_fn` with the project's configuration reports no error."""
    api = pytest.importorskip("mypy.api", reason="mypy is not installed: `scripts/setup.sh test` installs it")
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "mypy_cache"),  # nothing written into the checkout
            "--no-error-summary",
            str(REPO / "pimm_fn"),
        ]
    )
    assert status == 0, f"mypy found type errors in pimm_fn (exit {status}):\n{stdout}{stderr}"
