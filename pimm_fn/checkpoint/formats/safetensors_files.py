"""safetensors files, written and read: weights without pickle, to and from the rest of the ecosystem.

A ``.safetensors`` file is 8 bytes (the header's length, little-endian), a
JSON header naming each tensor's dtype, shape and byte range, then the
tensors' bytes: reading one never runs code. It is untrusted all the same:
the header is capped at :data:`MAX_HEADER` bytes and every field checked (a
dtype torch has, a shape whose bytes fill its range, ranges that tile the
data exactly, no name twice) before a tensor is made, so a damaged or
crafted file is a :class:`CheckpointError` naming it, never a failure deep
in torch. A file pimm_fn wrote records the SHA-256 of its header and its
tensors' bytes in the header's ``__metadata__`` (:data:`SHA256`), checked on
every read: a changed byte, a renamed tensor or another dtype is refused.

Reading needs nothing beyond torch: one of ours, a Hub model's
``model.safetensors`` (``__metadata__`` ``{"format": "pt"}`` or none), or a
Hub model sharded as ``model.safetensors.index.json`` beside its shards,
read whole. Writing (``python -m pimm_fn export --format safetensors``) uses
the ``safetensors`` package, the format's own writer: ``pip install
'pimm_fn[safetensors]'``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pathlib
import sys
from typing import Any

import torch

from pimm_fn.checkpoint import files, storage
from pimm_fn.checkpoint.errors import CheckpointError, cause, shown
from pimm_fn.core import untrusted_json

__all__ = [
    "MAX_HEADER",
    "SHA256",
    "INDEX",
    "SINGLE",
    "in_directory",
    "is_safetensors",
    "read_safetensors",
    "write_safetensors",
    "require",
]

MAX_HEADER = 100_000_000
"""The largest header read, in bytes: the ``safetensors`` package's own limit (a header of 100,000 tensors is ~10 MB)."""
SHA256 = "pimm_fn.sha256"
"""The ``__metadata__`` key of the SHA-256 (hex) a read checks: of the header (every tensor's name, dtype, shape and
offsets, and the other metadata) and of the bytes after it, so a changed name or dtype is caught as a changed byte."""
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
"""A Hub model's weights in a downloaded directory: one file, or the index of its shards."""

# safetensors' dtype names -> torch's; the packed 4- and 6-bit floats (F4, F6_*) have no torch dtype of that shape.
_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "F16": "float16",
    "BF16": "bfloat16",
    "U32": "uint32",
    "I32": "int32",
    "F32": "float32",
    "U64": "uint64",
    "I64": "int64",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
_ADVICE = (
    "Replace it with an intact copy: download it again, or export it again with "
    "`python -m pimm_fn export CHECKPOINT OUT.safetensors`"
)


def is_safetensors(path) -> bool:
    """Whether ``path`` names a safetensors file or a sharded model's index, by its name (as the ecosystem does)."""
    return path.name.endswith((".safetensors", ".safetensors.index.json"))


def in_directory(directory) -> pathlib.Path | None:
    """A downloaded Hub model's weights in ``directory``: its shards' index, else ``model.safetensors``; else ``None``."""
    return next((directory / name for name in (INDEX, SINGLE) if (directory / name).is_file()), None)


def require():
    """``safetensors.torch``, imported now; a missing package is an ``ImportError`` naming the extra."""
    try:
        return importlib.import_module("safetensors.torch")
    except ImportError as error:
        raise ImportError(
            "writing safetensors needs the safetensors package: pip install 'pimm_fn[safetensors]' "
            "(or pip install safetensors)"
        ) from error


def write_safetensors(out: pathlib.Path, tensors: dict, metadata: dict | None = None) -> None:
    """Write ``tensors`` (contiguous CPU tensors, none sharing memory) to ``out`` atomically, with ``metadata``.

    The ``safetensors`` package lays the file out; the header's
    ``__metadata__`` gets ``format: pt`` (what the Hub's readers expect),
    ``metadata`` (str to str) and :data:`SHA256`, the digest of the
    header and the tensors' bytes that :func:`read_safetensors` checks.

    Raises:
        ImportError: the ``safetensors`` package is missing (naming the extra).
        ValueError: a value is not a tensor (safetensors holds tensors only), naming its key.
    """
    st = require()
    others = [k for k, v in tensors.items() if not isinstance(v, torch.Tensor)]
    if others:
        raise ValueError(
            f"safetensors holds tensors only; {shown(others)} hold other values (a module's extra "
            f"state): export them as .pth"
        )
    blob = st.save(tensors, metadata={"format": "pt", **(metadata or {})})
    start = 8 + int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:start])
    data = memoryview(blob)[start:]
    header["__metadata__"][SHA256] = _digest(header, data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data stays 8-byte aligned, as the package lays it out

    def write(f):
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        f.write(data)

    files.atomic_write(out, write)


def read_safetensors(path) -> dict:
    """The tensors of a safetensors file, or of every shard a ``.safetensors.index.json`` names, on CPU.

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: naming the file: it is damaged or crafted (a header
            that is not the format's, ranges that do not tile its data, its
            recorded SHA-256 not matching), holds a dtype this torch lacks,
            or (an index) names a shard outside its directory or a tensor
            its shard does not hold.
    """
    path = storage.location(path)
    if path.name.endswith(".index.json"):
        return _read_sharded(path)
    return _read_file(path, path, path.name)


def _read_sharded(index: pathlib.Path) -> dict:
    """Every shard an index names, read and checked against the index's ``weight_map``."""
    where = index.parent

    def refuse(problem: str):
        return CheckpointError(where, index.name, problem, _ADVICE)

    try:
        record = files.read_json(index)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise refuse(f"cannot be read ({cause(exc)})") from None
    weight_map = record.get("weight_map") if isinstance(record, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise refuse(f"has no 'weight_map' of tensor names to shard files (got {shown(weight_map)})")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not _plain_name(shard):
            raise refuse(f"maps {shown(name)} to {shown(shard)}: a shard must be a .safetensors file beside the index")
    out: dict = {}
    for shard in sorted(set(weight_map.values())):
        try:
            tensors = _read_file(where / shard, where, shard)
        except FileNotFoundError:
            raise CheckpointError(where, shard, f"is missing, though {index.name} names it", _ADVICE) from None
        stray = [name for name in tensors if weight_map.get(name) != shard]
        if stray:
            raise CheckpointError(where, shard, f"holds {shown(stray)}, which {index.name} does not map to it", _ADVICE)
        out.update(tensors)
    missing = [name for name in weight_map if name not in out]
    if missing:
        raise refuse(f"maps {shown(missing)} to shards that do not hold them")
    return {name: out[name] for name in weight_map}


def _plain_name(name: str) -> bool:
    """A file name in the index's own directory: no separator, no ``..``, a ``.safetensors`` suffix."""
    return "/" not in name and "\\" not in name and name.endswith(".safetensors") and name not in (".", "..")


def _read_file(path, where, file: str) -> dict:
    """One safetensors file's tensors: its header read and checked before its data, then its recorded SHA-256, if any."""

    def refuse(problem: str, advice: str = _ADVICE):
        return CheckpointError(where, file, problem, advice)

    try:
        with _opened(path) as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise refuse(f"is {len(prefix)} bytes: no safetensors file (its first 8 give the header's length)")
            size = int.from_bytes(prefix, "little")
            if size > MAX_HEADER:
                raise refuse(
                    f"gives its header as {size:,} bytes, over the {MAX_HEADER:,} a header may have: "
                    f"damaged, or no safetensors file"
                )
            text = f.read(size)
            if len(text) < size:
                raise refuse(f"is cut short: its header is {size:,} bytes, {len(text):,} follow the first 8")
            try:
                header = untrusted_json.loads(text, object_pairs_hook=_unique_keys)
            except ValueError as exc:
                raise refuse(
                    f"has a header that does not parse ({cause(exc)}): damaged, or no safetensors file"
                ) from None
            data = _rest(f, path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise refuse(f"cannot be read ({cause(exc)})") from None
    entries, metadata = _checked_header(header, len(data), refuse)
    recorded = metadata.get(SHA256)
    if recorded is not None and _digest(header, data) != recorded:
        raise refuse(
            f"does not match the SHA-256 its header records ({SHA256}): its header or its bytes changed "
            f"since it was written"
        )
    if sys.byteorder != "little":
        raise refuse(
            "holds little-endian tensors, which this big-endian machine does not read", "Read it on another machine"
        )
    return {name: _tensor(data, entry, name, refuse) for name, entry in entries.items()}


def _digest(header: dict, data) -> str:
    """The SHA-256 of ``header`` (as canonical JSON, without the digest itself) and then of ``data``."""
    described = {**header, "__metadata__": {k: v for k, v in header.get("__metadata__", {}).items() if k != SHA256}}
    digest = hashlib.sha256(json.dumps(described, sort_keys=True, separators=(",", ":")).encode())
    digest.update(data)
    return digest.hexdigest()


def _opened(path):
    """``path`` opened for reading: a store's object as it is, a local file only if regular (never a FIFO waited on)."""
    return path.open("rb") if storage.is_store(path) else files.open_regular(path)


def _rest(f, path) -> bytearray:
    """The rest of the file, writable (tensors view it without a copy)."""
    if storage.is_store(path):
        return bytearray(f.read())
    data = bytearray(max(0, os.fstat(f.fileno()).st_size - f.tell()))
    view, got = memoryview(data), 0
    while got < len(data) and (n := f.readinto(view[got:])):
        got += n
    if got != len(data) or f.read(1):
        raise OSError(f"it changed size while read ({got:,} of {len(data):,} bytes after the header)")
    return data


def _unique_keys(pairs) -> dict:
    """A JSON object that names each key once (a second ``"w"`` would silently replace the first)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the name {shown(key)} appears twice")
            seen.add(key)
    return out


def _checked_header(header, length: int, refuse) -> tuple[dict, dict]:
    """``(tensors, metadata)`` of a header, once every field is what the format allows and the ranges tile ``length``."""
    if not isinstance(header, dict):
        raise refuse(f"has a header holding a JSON {type(header).__name__}, not an object of tensors")
    metadata = header.get("__metadata__")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise refuse(f"has a __metadata__ that is not an object of strings (got {shown(metadata)})")
    entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
    spans = []
    for name, entry in entries.items():
        fields: tuple[Any, ...] = (  # as the JSON has them: checked below
            (entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")) if isinstance(entry, dict) else ()
        )
        if len(fields) != 3 or not isinstance(fields[0], str) or not _ints(fields[1]) or not _ints(fields[2], 2):
            raise refuse(
                f"describes tensor {shown(name)} as {shown(entry, 120)}; expected dtype, shape and "
                f"data_offsets [begin, end]"
            )
        dtype, shape, (begin, end) = fields
        torch_dtype = _dtype(dtype, name, refuse)
        numel = 1
        for d in shape:
            numel *= d
        if end > length:
            raise refuse(
                f"gives tensor {shown(name)} the bytes {begin:,}..{end:,}, past the {length:,} of its data: "
                f"cut short, or damaged"
            )
        if begin > end or end - begin != numel * torch_dtype.itemsize:
            raise refuse(
                f"gives tensor {shown(name)} ({dtype} {shape}: {numel * torch_dtype.itemsize:,} bytes) the "
                f"bytes {begin:,}..{end:,}: they do not fit it"
            )
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise refuse(
                f"has {'bytes no tensor owns' if begin > at else 'tensors sharing bytes'} at byte {at:,} "
                f"of its data (tensor {shown(name)} starts at {begin:,})"
            )
        at = end
    if at != length:
        raise refuse(f"has {length - at:,} bytes after its last tensor: damaged, or not written as one file")
    return entries, metadata


def _ints(value, count: int | None = None) -> bool:
    return (
        isinstance(value, list)
        and (count is None or len(value) == count)
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 for v in value)
    )


def _dtype(name: str, tensor: str, refuse) -> torch.dtype:
    """The torch dtype of safetensors' ``name``; one this torch lacks is refused, naming it and the tensor."""
    attr = _DTYPES.get(name)
    if attr is None or not hasattr(torch, attr):
        has = f"torch {torch.__version__} has no dtype for it" if attr else "no dtype pimm_fn reads"
        advice = f"Convert {shown(tensor)} to a dtype torch has (F32, BF16, ...) before saving it" + (
            ", or use a newer torch" if attr else ""
        )
        raise refuse(f"holds tensor {shown(tensor)} of dtype {shown(name)}: {has}", advice)
    return getattr(torch, attr)


def _tensor(data: bytearray, entry: dict, name: str, refuse) -> torch.Tensor:
    """One tensor over ``data`` (no copy unless its bytes are misaligned for its dtype); bools only 0 or 1."""
    dtype, shape = getattr(torch, _DTYPES[entry["dtype"]]), entry["shape"]
    begin, end = entry["data_offsets"]
    try:
        if begin == end:
            return torch.empty(shape, dtype=dtype)
        tensor = torch.frombuffer(data, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=begin).reshape(shape)
    except (RuntimeError, ValueError, OverflowError) as exc:  # a shape torch cannot make (too many dimensions)
        raise refuse(f"describes tensor {shown(name)} with a shape torch cannot make ({cause(exc)})") from None
    if dtype == torch.bool and bool((tensor.view(torch.uint8) > 1).any()):
        raise refuse(f"holds bool tensor {shown(name)} with bytes other than 0 and 1")
    return tensor.clone() if begin % dtype.itemsize else tensor
