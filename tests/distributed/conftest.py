"""Shared runs for the multi-process tests: each is launched once per session."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _launch import results, run_ranks  # noqa: E402


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """An uninterrupted 2-rank run of the standard hooks: each rank's results.

    Each rank a fresh interpreter with its own hash seed: the traces compared across ranks and with the plan
    must agree whatever order each rank's sets of strings iterate in.
    """
    out = tmp_path_factory.mktemp("reference")
    run_ranks("train", 2, out, save_dir=str(out / "run"), tag="ref", hash_seeds=True).check()
    return results(out, "ref", 2)
