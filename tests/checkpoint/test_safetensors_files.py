"""safetensors files: ours and the Hub's read back bit-identical; a damaged or crafted one is a CheckpointError naming it."""

import hashlib
import json
import os
import pathlib
import struct
import sys

import pytest
import torch
from hypothesis import given, strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pimm_fn.checkpoint import CheckpointError, load_weights_file
from pimm_fn.checkpoint.formats.safetensors_files import MAX_HEADER, SHA256, read_safetensors, write_safetensors

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _stuck import within  # noqa: E402

EVERY_DTYPE = {
    "f32": torch.randn(3, 4),
    "f64": torch.randn(5, dtype=torch.float64),
    "f16": torch.randn(2, 3).half(),
    "bf16": torch.randn(7).bfloat16(),
    "i64": torch.arange(-3, 3),
    "i32": torch.arange(4, dtype=torch.int32),
    "i16": torch.arange(3, dtype=torch.int16),
    "i8": torch.arange(-2, 2, dtype=torch.int8),
    "u8": torch.arange(250, 256, dtype=torch.uint8),
    "u16": torch.tensor([65535, 1], dtype=torch.uint16),
    "u32": torch.tensor([2**32 - 1], dtype=torch.uint32),
    "u64": torch.tensor([2**63 + 5], dtype=torch.uint64),
    "bool": torch.tensor([True, False, True]),
    "c64": torch.randn(2, dtype=torch.complex64),
    "f8": torch.randn(4).to(torch.float8_e4m3fn),
    "f8b": torch.randn(4).to(torch.float8_e5m2),
    "scalar": torch.tensor(2.5),
    "empty": torch.zeros(0, 3),
    "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
}


def _raw(path, header, data=b"", *, length=None):
    """A file laid out as safetensors: the header's length, the header (a dict as JSON, or bytes as given), the data."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head) if length is None else length) + head + data)
    return path


def test_a_written_file_reads_back_bit_identical_in_every_dtype(tmp_path, same):
    """Every dtype torch and safetensors share reads back with its dtype, shape and bits, here and in the package."""
    path = tmp_path / "w.safetensors"
    write_safetensors(path, EVERY_DTYPE, {"pimm_fn.step": "12"})
    back = read_safetensors(path)
    same(dict(sorted(back.items())), dict(sorted(EVERY_DTYPE.items())))
    theirs = load_file(str(path))  # the format's own reader takes the file as it is
    same(dict(sorted(theirs.items())), dict(sorted(EVERY_DTYPE.items())))


def test_a_written_file_records_format_metadata_and_the_digest_of_its_header_and_tensor_bytes(tmp_path):
    """__metadata__ holds format 'pt', the metadata given and the SHA-256 of the header (without it) and every byte after."""
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"w": torch.ones(3)}, {"pimm_fn.step": "4"})
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    raw = path.read_bytes()
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    assert start % 8 == 0  # the tensors stay aligned
    header = json.loads(raw[8:start])
    header["__metadata__"].pop(SHA256)
    described = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + raw[start:])
    assert metadata == {"format": "pt", "pimm_fn.step": "4", SHA256: described.hexdigest()}


def test_a_value_that_is_no_tensor_is_refused_naming_it(tmp_path):
    """safetensors holds tensors only: a module's extra state is refused by key, nothing written."""
    with pytest.raises(ValueError, match=r"\['head._extra_state'\] hold other values .* export them as .pth"):
        write_safetensors(tmp_path / "w.safetensors", {"w": torch.ones(1), "head._extra_state": {"v": 1}})
    assert list(tmp_path.iterdir()) == []


def test_writing_without_the_package_names_the_extra(tmp_path, monkeypatch):
    """Without the safetensors package a write is an ImportError naming pip install 'pimm_fn[safetensors]'."""
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match=r"pip install 'pimm_fn\[safetensors\]'"):
        write_safetensors(tmp_path / "w.safetensors", {"w": torch.ones(1)})


@pytest.mark.parametrize("metadata", [{"format": "pt"}, None], ids=["format-pt", "no-metadata"])
def test_a_hub_file_reads_with_or_without_metadata(tmp_path, same, metadata):
    """A file the safetensors package wrote, as Hub models are, reads back bit-identical (nothing recorded to check)."""
    tensors = {"model.embed.weight": torch.randn(4, 3).bfloat16(), "model.norm.bias": torch.zeros(3)}
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata=metadata)
    same(dict(sorted(read_safetensors(tmp_path / "model.safetensors").items())), tensors)
    same(dict(sorted(load_weights_file(tmp_path / "model.safetensors").items())), tensors)
    same(dict(sorted(load_weights_file(tmp_path).items())), tensors)  # a downloaded model's directory


def _sharded(root, tensors, shards):
    """A Hub model sharded as the Hub writes one: ``model-0000i-of-0000n.safetensors`` and the index mapping each tensor."""
    weight_map = {}
    for i, names in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in names}, str(root / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in names})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    )
    return root / "model.safetensors.index.json"


TENSORS = {"a.w": torch.randn(2, 2), "b.w": torch.randn(3), "c.w": torch.arange(4)}


def test_a_sharded_hub_model_reads_whole_through_its_index(tmp_path, same):
    """The index's shards read whole, in the index's order, from the index or from the model's directory."""
    index = _sharded(tmp_path, TENSORS, [["a.w", "c.w"], ["b.w"]])
    same(read_safetensors(index), TENSORS)
    same(load_weights_file(index), TENSORS)
    same(load_weights_file(tmp_path), TENSORS)


@pytest.mark.parametrize(
    "change, file, match",
    [
        (
            lambda index: index.update(weight_map={"a.w": "../model-00001-of-00002.safetensors"}),
            "model.safetensors.index.json",
            r"maps 'a.w' to '\.\./model-00001-of-00002.safetensors': a shard must be a .safetensors file beside the index",
        ),
        (
            lambda index: index.update(weight_map={"a.w": "/etc/passwd"}),
            "model.safetensors.index.json",
            "beside the index",
        ),
        (lambda index: index.update(weight_map=[]), "model.safetensors.index.json", "has no 'weight_map'"),
        (
            lambda index: index["weight_map"].update({"d.w": "model-00003-of-00003.safetensors"}),
            "model-00003-of-00003.safetensors",
            "is missing, though model.safetensors.index.json names it",
        ),
        (
            lambda index: index["weight_map"].update({"d.w": "model-00002-of-00002.safetensors"}),
            "model.safetensors.index.json",
            r"maps \['d.w'\] to shards that do not hold them",
        ),
        (
            lambda index: index["weight_map"].update({"a.w": "model-00002-of-00002.safetensors"}),
            "model-00001-of-00002.safetensors",
            r"holds \['a.w'\], which model.safetensors.index.json does not map to it",
        ),
    ],
)
def test_an_index_that_does_not_fit_its_shards_is_refused_naming_the_file(tmp_path, change, file, match):
    """A shard outside the index's directory, missing, or holding other tensors than the index says is a CheckpointError."""
    index_path = _sharded(tmp_path, TENSORS, [["a.w", "c.w"], ["b.w"]])
    index = json.loads(index_path.read_text())
    change(index)
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=match) as caught:
        load_weights_file(index_path)
    assert caught.value.file == file


F32_2 = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
CRAFTED = {
    "empty": (b"", None, None, r"is 0 bytes: no safetensors file"),
    "header-too-large": (
        b"{}",
        b"",
        MAX_HEADER + 1,
        r"gives its header as 100,000,001 bytes, over the 100,000,000 a header may have",
    ),
    "header-past-the-end": (b"{}", b"", 1000, r"is cut short: its header is 1,000 bytes, 2 follow the first 8"),
    "header-not-utf8": (b"\xff\xfe{}", b"", None, r"has a header that does not parse"),
    "header-not-json": (b"{'w': 1}", b"", None, r"has a header that does not parse"),
    "header-nested-deep": (b"[" * 100_000, b"", None, r"has a header that does not parse"),
    "header-a-list": ([1, 2], b"", None, r"has a header holding a JSON list, not an object of tensors"),
    "name-twice": (
        b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
        b'"w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}',
        b"ab",
        None,
        r"'w' appears twice",
    ),
    "no-offsets": (
        {"w": {"dtype": "F32", "shape": [2]}},
        b"\0" * 8,
        None,
        r"describes tensor 'w' as .* expected dtype",
    ),
    "negative-dim": ({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "expected dtype"),
    "bool-dim": ({"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4, None, "expected dtype"),
    "float-offset": (
        {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8.0]}},
        b"\0" * 8,
        None,
        "expected dtype",
    ),
    "three-offsets": (
        {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}},
        b"\0" * 8,
        None,
        "expected dtype",
    ),
    "end-before-begin": (
        {"w": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}},
        b"\0" * 4,
        None,
        "do not fit it",
    ),
    "past-the-data": (
        {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
        b"\0" * 8,
        None,
        r"gives tensor 'w' the bytes 0..16, past the 8 of its data: cut short",
    ),
    "wrong-size": (
        {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
        b"\0" * 8,
        None,
        r"gives tensor 'w' \(F32 \[3\]: 12 bytes\) the bytes 0..8: they do not fit it",
    ),
    "sharing-bytes": (
        {**F32_2, "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
        b"\0" * 8,
        None,
        r"has tensors sharing bytes at byte 8 of its data \(tensor 'v' starts at 4\)",
    ),
    "a-gap": (
        {"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
        b"\0" * 8,
        None,
        r"has bytes no tensor owns at byte 0",
    ),
    "trailing-bytes": (F32_2, b"\0" * 12, None, r"has 4 bytes after its last tensor"),
    "unknown-dtype": (
        {"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}},
        b"\0" * 8,
        None,
        r"holds tensor 'w' of dtype 'Q7': no dtype pimm_fn reads",
    ),
    "packed-4-bit": (
        {"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}},
        b"\0",
        None,
        r"holds tensor 'w' of dtype 'F4': no dtype pimm_fn reads",
    ),
    "metadata-not-strings": (
        {"__metadata__": {"step": 3}, **F32_2},
        b"\0" * 8,
        None,
        r"has a __metadata__ that is not an object of strings",
    ),
    "bool-byte-2": (
        {"b": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}},
        b"\x01\x02",
        None,
        r"holds bool tensor 'b' with bytes other than 0 and 1",
    ),
    "shape-torch-cannot-make": (
        {"w": {"dtype": "F32", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}},
        b"",
        None,
        r"describes tensor 'w' with a shape torch cannot make",
    ),
    "digest-not-matching": (
        {"__metadata__": {SHA256: "0" * 64}, **F32_2},
        b"\0" * 8,
        None,
        r"does not match the SHA-256 its header records",
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_damaged_or_crafted_file_is_a_checkpoint_error_naming_it(tmp_path, case):
    """Each field of the header is checked before a tensor is made: a bad one is a CheckpointError saying what and where."""
    header, data, length, match = CRAFTED[case]
    path = tmp_path / "w.safetensors"
    if header == b"" and data is None:
        path.write_bytes(b"")
    else:
        _raw(path, header, data, length=length)
    with pytest.raises(CheckpointError, match=match) as caught:
        load_weights_file(path)
    assert caught.value.file == "w.safetensors" and str(path) in str(caught.value)


def test_a_flipped_byte_in_the_tensors_of_an_exported_file_is_caught_by_its_digest(tmp_path):
    """Bytes changed after the write, at the same size, fail the SHA-256 the header records."""
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"w": torch.zeros(16)})
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(
        CheckpointError,
        match=r"w.safetensors does not match the SHA-256 its header records .*"
        r"Replace it with an intact copy",
    ):
        load_weights_file(path)


def test_a_fifo_in_place_of_the_file_is_never_waited_on(tmp_path):
    """A FIFO named like a safetensors file is refused at once, not read."""
    os.mkfifo(tmp_path / "w.safetensors")
    with within(30, "reading a FIFO"), pytest.raises(CheckpointError, match="is a FIFO, not a regular file"):
        load_weights_file(tmp_path / "w.safetensors")


def test_a_missing_file_is_file_not_found(tmp_path):
    """No file at the path is a FileNotFoundError, as for any warm-start source."""
    with pytest.raises(FileNotFoundError):
        load_weights_file(tmp_path / "w.safetensors")
    with pytest.raises(FileNotFoundError):  # a directory with neither a checkpoint nor a Hub model's weights
        load_weights_file(tmp_path)


FUZZED = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([True, False]), "i": torch.arange(3)}


def _written(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "w.safetensors"
    write_safetensors(path, FUZZED)
    return path.read_bytes()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return _written(tmp_path_factory)


@given(data=st.data())
def test_a_file_cut_short_or_with_any_byte_changed_reads_whole_or_is_a_checkpoint_error(
    written, tmp_path_factory, data
):
    """Truncated anywhere or with one byte changed, a file either reads (a change the header allows) or is refused:
    never another exception."""
    raw = bytearray(written)
    if data.draw(st.booleans(), label="cut"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="length")]
    else:
        raw[data.draw(st.integers(0, len(raw) - 1), label="at")] ^= data.draw(st.integers(1, 255), label="xor")
    path = tmp_path_factory.mktemp("case") / "w.safetensors"
    path.write_bytes(bytes(raw))
    try:
        tensors = read_safetensors(path)
    except CheckpointError:
        return
    assert set(tensors) == set(FUZZED)  # only the header's layout changed (its whitespace): the same tensors
    assert all(tensors[k].dtype == v.dtype and torch.equal(tensors[k], v) for k, v in FUZZED.items())


@pytest.mark.parametrize(
    "change",
    [(b'"i":', b'"h":'), (b'"I64"', b'"F64"'), (b'"shape":[2,3]', b'"shape":[3,2]')],
    ids=["renamed", "other-dtype", "other-shape"],
)
def test_a_header_changed_where_the_format_still_allows_it_is_refused_by_the_digest(tmp_path_factory, change):
    """A tensor renamed, given another dtype of its size or another shape of its numel: the SHA-256 refuses it."""
    raw = _written(tmp_path_factory)
    assert raw.count(change[0]) == 1
    path = tmp_path_factory.mktemp("changed") / "w.safetensors"
    path.write_bytes(raw.replace(*change))
    with pytest.raises(CheckpointError, match="header or its bytes changed"):
        read_safetensors(path)


def test_a_file_on_an_fsspec_store_reads_and_is_checked_as_a_local_one(tmp_path, same):
    """A safetensors object on a store (memory://) reads back bit-identical; its recorded digest is checked there too."""
    import fsspec

    write_safetensors(tmp_path / "w.safetensors", TENSORS)
    raw = (tmp_path / "w.safetensors").read_bytes()
    store = fsspec.filesystem("memory")
    store.pipe(f"/{tmp_path.name}/w.safetensors", raw)
    store.pipe(f"/{tmp_path.name}/flipped.safetensors", raw[:-1] + bytes([raw[-1] ^ 1]))
    try:
        same(dict(sorted(load_weights_file(f"memory://{tmp_path.name}/w.safetensors").items())), TENSORS)
        with pytest.raises(CheckpointError, match="flipped.safetensors does not match the SHA-256"):
            load_weights_file(f"memory://{tmp_path.name}/flipped.safetensors")
    finally:
        store.rm(f"/{tmp_path.name}", recursive=True)
