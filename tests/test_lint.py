"""The code stays as its linter and formatter leave it: ``ruff check`` and ``ruff format --check`` report nothing."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _ruff(*args) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_to_say_of_the_code():
    """pyflakes, pycodestyle and import order, as pyproject.toml's [tool.ruff.lint] selects them: nothing found."""
    done = _ruff("check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_file_is_as_the_formatter_writes_it():
    """``ruff format --check``: no file would be reformatted (run ``ruff format .`` to fix one)."""
    done = _ruff("format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr
