"""Shared helpers for checkpoint tests: exact (bit-level) comparison of trees."""

import numpy as np
import pytest
import torch


def assert_same(a, b, path="obj"):
    """Assert two trees are equal in type, structure, dtype and bits."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
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
