"""pack/unpack: the JSON skeleton + tensors split of nested trainer state."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pimm_fn.checkpoint.formats.pack import pack, skeleton_to_tensor, tensor_to_skeleton, unpack

_DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.int8,
]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(_DTYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    raw = draw(st.binary(min_size=0, max_size=64))
    n = int(np.prod(shape)) if shape else 1
    size = n * torch.empty((), dtype=dtype).element_size()
    base = torch.tensor(list(raw.ljust(size, b"\x01")[:size]), dtype=torch.uint8)
    if dtype == torch.bool:
        return (base[:n] % 2).bool().reshape(shape)
    return base.view(dtype).reshape(shape)


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    tensors(),
)
keys = st.one_of(st.text(max_size=5), st.integers(-5, 5), st.booleans(), st.none(), st.tuples(st.integers(0, 3)))
trees = st.recursive(
    leaves,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.tuples(kids, kids), st.dictionaries(keys, kids, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(trees)
def test_pack_unpack_round_trips_any_nested_tree(same, tree):
    """unpack(pack(x)) equals x in types, structure, dtypes and bits; shrinks to the smallest failing tree."""
    skeleton, tensors_ = pack(tree)
    json.loads(skeleton)  # strict JSON, no NaN literals
    same(tree, unpack(tensor_to_skeleton(skeleton_to_tensor(skeleton)), tensors_))


def test_pack_keeps_tuples_int_keys_and_numpy_rng_state(same):
    """Optimizer-style int keys, tuples, numpy RNG state and numpy scalars survive exactly."""
    obj = {
        "state": {0: {"step": torch.tensor(3.0)}},
        "betas": (0.9, 0.999),
        "np": np.random.get_state(),
        "s": np.float32(1.5),
        "big": 2**80,
        "neg0": -0.0,
    }
    out = unpack(*pack(obj))
    same(obj, out)
    assert str(out["neg0"]) == "-0.0"


def test_pack_rejects_unsupported_leaf_naming_its_path():
    """An object leaf is refused with a TypeError that names where it is."""
    with pytest.raises(TypeError, match=r"obj\['sched'\]\['fn'\] has type .*function"):
        pack({"sched": {"fn": lambda: 1}})


def test_unpack_rejects_missing_and_unreferenced_tensors():
    """A skeleton paired with the wrong tensors fails loudly."""
    skeleton, tensors_ = pack({"t": torch.ones(1)})
    with pytest.raises(ValueError, match="missing"):
        unpack(skeleton, {})
    with pytest.raises(ValueError, match="not referenced"):
        unpack(skeleton, {**tensors_, "9": torch.ones(1)})
    with pytest.raises(ValueError, match="valid JSON"):
        unpack("{", {})


def test_a_skeleton_nested_too_deeply_is_a_value_error_not_a_recursion_error():
    """A crafted skeleton of 100,000 brackets is malformed like any other: refused before the parser recurses."""
    with pytest.raises(ValueError, match=r"not valid JSON \(nested too deeply to parse\)"):
        unpack("[" * 100000, {})
