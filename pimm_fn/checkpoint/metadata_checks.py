"""The shape of DCP metadata read from a checkpoint: every field of the type DCP writes, checked once after unpickling.

:class:`.metadata_unpickler.MetadataUnpickler` admits DCP's own classes only,
but a pickle fills their fields with whatever it holds: a crafted
``.metadata`` could list a tensor whose ``properties`` are ``None``, whose
size is a string, or a storage offset that is a string, and every reader
would then fail with a raw ``TypeError`` somewhere deep in pimm_fn or in DCP.
:func:`problem` checks the whole structure once, as
:func:`.safe_reading.metadata` reads it, so that everything downstream may
trust the types::

    Metadata
      state_dict_metadata: dict[str, TensorStorageMetadata | BytesStorageMetadata]
        TensorStorageMetadata: properties  TensorProperties (a torch.dtype, layout, memory format; bools)
                               size        torch.Size / tuple of ints >= 0
                               chunks      list[ChunkStorageMetadata]: offsets, sizes of the tensor's rank,
                                           inside it, together exactly as many elements as it has
      storage_data: dict[MetadataIndex, _StorageInfo]   (relative_path str; offset, length ints >= 0),
                    one entry for every chunk and every pickled entry
      planner_data: dict or None;  storage_meta: StorageMeta or None;  version: str or None

A chunk's bytes also fit in the stored length its entry records (unless that
entry names storage transforms, e.g. compression), so no size a checkpoint
claims exceeds the bytes it says it holds. What the file names the data
files are is :mod:`.safe_reading`'s check (``_check_files``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata, ChunkStorageMetadata, Metadata, MetadataIndex, StorageMeta, TensorProperties,
    TensorStorageMetadata,
)

from .errors import shown

__all__ = ["problem"]

_MISSING = object()
_LIMIT = 2**63  # a tensor's sizes and numel, and a file's offsets, are int64


class _Bad(Exception):
    """What is wrong with the metadata, said as the rest of a sentence about ``.metadata``."""


def problem(meta: Metadata) -> str | None:
    """What is wrong with the structure of ``meta``, as the rest of a sentence about ``.metadata``; ``None``: sound.

    Example:
        >>> problem(Metadata(state_dict_metadata=[1, 2]))
        'has state_dict_metadata [1, 2] where DCP writes dict'
        >>> problem(Metadata(state_dict_metadata={}, storage_data={})) is None
        True
    """
    try:
        _check(meta)
    except _Bad as exc:
        return str(exc)
    return None


def _check(meta: Metadata) -> None:
    entries = _field(meta, "state_dict_metadata", dict, "state_dict_metadata")
    storage = _field(meta, "storage_data", dict, "storage_data")
    _field(meta, "planner_data", (dict, type(None)), "planner_data")
    _field(meta, "storage_meta", (StorageMeta, type(None)), "storage_meta")
    _field(meta, "version", (str, type(None)), "version")
    for index, info in storage.items():
        _storage_entry(index, info)
    for key, entry in entries.items():
        if not isinstance(key, str):
            raise _Bad(f"lists an entry named {shown(key)} where DCP writes a string")
        if isinstance(entry, TensorStorageMetadata):
            _tensor_entry(key, entry, storage)
        elif isinstance(entry, BytesStorageMetadata):
            if MetadataIndex(key) not in storage:
                raise _Bad(f"lists {key!r} as a pickled entry but no storage for it")
        else:
            raise _Bad(f"lists {key!r} as an object of type {type(entry).__name__}, which DCP never writes")


def _storage_entry(index: Any, info: Any) -> None:
    if not isinstance(index, MetadataIndex):
        raise _Bad(f"has a storage_data key {shown(index)} where DCP writes a MetadataIndex")
    fqn = _field(index, "fqn", str, "the fqn of a storage_data key")
    where = f"the storage of {fqn!r}"
    offset = _field(index, "offset", (torch.Size, tuple, type(None)), f"the key offset of {where}")
    if offset is not None:
        _ints(offset, f"the key offset of {where}")
    _field(index, "index", (int, type(None)), f"the key index of {where}")
    if not isinstance(info, _StorageInfo):
        raise _Bad(f"describes {where} as a {type(info).__name__} where DCP writes a _StorageInfo")
    _field(info, "relative_path", str, f"the relative_path of {where}")
    _count(_field(info, "offset", int, f"the offset of {where}"), f"the offset of {where}")
    _count(_field(info, "length", int, f"the length of {where}"), f"the length of {where}")
    transforms = _field(info, "transform_descriptors", (list, tuple, type(None)),
                        f"the transform_descriptors of {where}")
    if transforms is not None and not all(isinstance(t, str) for t in transforms):
        raise _Bad(f"describes {where} with transform_descriptors {shown(transforms)} where DCP writes strings")


def _tensor_entry(key: str, entry: TensorStorageMetadata, storage: dict) -> None:
    where = f"tensor {key!r}"
    properties = _field(entry, "properties", TensorProperties, f"the properties of {where}")
    dtype = _field(properties, "dtype", torch.dtype, f"the dtype of {where}")
    _field(properties, "layout", torch.layout, f"the layout of {where}")
    _field(properties, "memory_format", torch.memory_format, f"the memory_format of {where}")
    _field(properties, "requires_grad", bool, f"the requires_grad of {where}")
    _field(properties, "pin_memory", bool, f"the pin_memory of {where}")
    size = _ints(_field(entry, "size", (torch.Size, tuple), f"the size of {where}"), f"the size of {where}")
    if math.prod(size) >= _LIMIT:
        raise _Bad(f"has the size {shown(list(size))} of {where}, more elements than a tensor can hold")
    chunks = _field(entry, "chunks", list, f"the chunks of {where}")
    total = 0
    for chunk in chunks:
        if not isinstance(chunk, ChunkStorageMetadata):
            raise _Bad(f"lists a chunk of {where} as a {type(chunk).__name__} where DCP writes a ChunkStorageMetadata")
        offsets = _ints(_field(chunk, "offsets", (torch.Size, tuple), f"the offsets of a chunk of {where}"),
                        f"the offsets of a chunk of {where}")
        sizes = _ints(_field(chunk, "sizes", (torch.Size, tuple), f"the sizes of a chunk of {where}"),
                      f"the sizes of a chunk of {where}")
        at = f"a chunk of {where} at {shown(list(offsets))} of {shown(list(sizes))}"
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise _Bad(f"lists {at}, not of the tensor's rank {len(size)} (size {shown(list(size))})")
        if any(o + s > n for o, s, n in zip(offsets, sizes, size)):
            raise _Bad(f"lists {at}, outside its size {shown(list(size))}")
        info = storage.get(MetadataIndex(key, offsets))
        if info is None:
            raise _Bad(f"lists {at} but no storage for it")
        nbytes = math.prod(sizes) * dtype.itemsize
        if not info.transform_descriptors and nbytes > info.length:
            raise _Bad(f"lists {at} ({nbytes:,} bytes) stored in {info.length:,} bytes")
        total += math.prod(sizes)
    if total != math.prod(size):
        raise _Bad(f"lists chunks of {where} holding {total:,} elements where its size {shown(list(size))} has "
                   f"{math.prod(size):,}")


def _field(obj: Any, name: str, types, what: str) -> Any:
    """``obj.name``, which must be one of ``types`` (a bool is never taken for an int)."""
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        raise _Bad(f"lacks {what}")
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        expected = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
        raise _Bad(f"has {what} {shown(value)} where DCP writes {expected}")
    return value


def _ints(values, what: str) -> tuple:
    """``values`` as a tuple, each an ``int`` (not a bool) in ``[0, 2**63)``."""
    for n in values:
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < _LIMIT:
            raise _Bad(f"has {what} {shown(values)} where DCP writes integers in [0, 2**63)")
    return tuple(values)


def _count(n: int, what: str) -> None:
    if not 0 <= n < _LIMIT:
        raise _Bad(f"has {what} {shown(n)} where DCP writes an integer in [0, 2**63)")
