"""Shared helpers for checkpoint tests: exact (bit-level) comparison of trees, finished runs to damage copies of."""

import pathlib
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402


def assert_same(a, b, path="obj"):
    """Assert two trees are equal in type, structure, dtype and bits."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        )
        assert torch.equal(_bits(a), _bits(b)), f"{path}: tensor bits differ"
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b), f"{path}: numpy dtype/shape differ"
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"{path}: numpy bits differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, f"{path}: nan != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _bits(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


@pytest.fixture(scope="session")
def same():
    """The exact tree comparison, as a fixture."""
    return assert_same


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
    """Finished 10-step runs under ``standard/`` and ``legacy/`` (``tw.finished``): last (step 10), iter_4, iter_8,
    iter_10; a test damages a copy."""
    root = tmp_path_factory.mktemp("finished")
    for fmt in ("standard", "legacy"):
        tw.finished(root / fmt, fmt)
    return root
