"""Shared runs for the multi-process tests: each is launched once per session."""

import pathlib
import pickle
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _launch import run_ranks  # noqa: E402


def results(out, tag, world) -> list:
    """What each rank of the launch tagged ``tag`` dumped, in rank order."""
    found = []
    for rank in range(world):
        with open(pathlib.Path(out) / f"{tag}-rank{rank}.pkl", "rb") as f:
            found.append(pickle.load(f))
    return found


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """An uninterrupted 2-rank run of the standard hooks: each rank's results."""
    out = tmp_path_factory.mktemp("reference")
    run_ranks("train", 2, out, save_dir=str(out / "run"), tag="ref").check()
    return results(out, "ref", 2)
