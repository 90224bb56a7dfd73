"""The one way pimm_fn reads a ``torch.distributed.checkpoint`` (DCP) directory: its metadata unpickled to DCP's classes only, and checked.

A DCP directory is untrusted input. DCP pickles its metadata (``.metadata``)
and every entry that is not a tensor (``BytesStorageMetadata``), and its
default load planner reads such an entry with ``torch.load(weights_only=False)``,
which runs whatever the bytes say: a checkpoint listing a pickled object
where the reader expects a tensor would choose to run code.

Every DCP read of pimm_fn goes through the two functions here (a test scans
the package for any other ``dcp.load`` or ``FileSystemReader``):

- :func:`metadata` unpickles ``.metadata`` with :class:`pimm_fn.checkpoint.formats.dcp_reading.MetadataUnpickler`,
  which admits DCP's own metadata classes and the torch and standard types
  they hold, as CPython 3.10-3.13 pickle them, and nothing else; every field
  must then be of the type DCP writes (:mod:`pimm_fn.checkpoint.formats.dcp_reading`), and the data
  files it names must lie in the directory itself.
- :func:`load` checks its template against that metadata before a byte is
  read: each tensor must be listed as a tensor of the same shape and dtype,
  and a pickled entry is refused, unless the caller reads plain values
  (pimm's own DCP payloads: ``plain_values=True``), which only
  ``torch.load(weights_only=True)`` reads (containers, numbers, strings,
  tensors, numpy arrays: never an object). pimm_fn itself writes tensors
  only (its skeletons are ``uint8`` tensors).

The reader refuses to read data for any planner but this module's, so a
``dcp.load`` written elsewhere fails instead of unpickling. A checkpoint on
an fsspec store (:mod:`.storage`) is read the same way, through DCP's
fsspec reader wrapped alike (:class:`_StoreReader`): the same metadata
unpickler, the same checks, the same planner.

What DCP's pickled ``.metadata`` may name when pimm_fn unpickles it: DCP's own metadata classes, and nothing else.

``MetadataUnpickler`` admits DCP's dataclasses and enums and the torch and
standard types they hold, as CPython 3.10-3.13 pickle them; any other
class a crafted ``.metadata`` names is refused before it could run.
:mod:`pimm_fn.checkpoint.formats.dcp_reading` reads every DCP directory through it.

The shape of DCP metadata read from a checkpoint: every field of the type DCP writes, checked once after unpickling.

:class:`pimm_fn.checkpoint.formats.dcp_reading.MetadataUnpickler` admits DCP's own classes only,
but a pickle fills their fields with whatever it holds: a crafted
``.metadata`` could list a tensor whose ``properties`` are ``None``, whose
size is a string, or a storage offset that is a string, and every reader
would then fail with a raw ``TypeError`` somewhere deep in pimm_fn or in DCP.
:func:`problem` checks the whole structure once, as
:func:`pimm_fn.checkpoint.formats.dcp_reading.metadata` reads it, so that everything downstream may
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
files are is :mod:`pimm_fn.checkpoint.formats.dcp_reading`'s check (``_check_files``).
"""

from __future__ import annotations

import dataclasses
import enum
import io
import math
import os
import pathlib
import pickle
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from pimm_fn.checkpoint import files, storage
from pimm_fn.checkpoint.errors import CheckpointError, cause, shown

__all__ = [
    "MetadataUnpickler",
    "problem",
    "metadata",
    "load",
    "empty",
    "plain_globals",
]


_PATHS = ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler for DCP's ``.metadata`` that admits what DCP metadata holds and nothing else.

    DCP's own dataclasses and enums, ``torch.Size``, dtypes, layouts and
    memory formats, paths (``pathlib``, ``pathlib._local`` on 3.13) and
    ``OrderedDict``. An enum member pickled as ``getattr(EnumClass, "NAME")``
    (CPython 3.11.0-3.11.x before the revert, e.g. Debian 12's 3.11.2) is
    admitted through :func:`_enum_member`, which applies to an admitted DCP
    enum and one of its member names only: ``builtins.getattr`` itself is
    never handed out.
    """

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint"):
            obj = super().find_class(module, name)
            if _is_dcp_type(obj):
                return obj
        elif module == "builtins" and name == "getattr":
            return _enum_member
        elif module == "torch.serialization" and name == "_get_layout":  # layout name -> torch.layout
            return super().find_class(module, name)
        elif module == "torch":
            obj = getattr(torch, name, None)
            if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        elif module in ("pathlib", "pathlib._local") and name in _PATHS:
            return getattr(pathlib, name)
        elif module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"DCP metadata references {module}.{name}, which is not allowed to load")


def _is_dcp_type(obj: Any) -> bool:
    return (
        isinstance(obj, type)
        and obj.__module__.startswith("torch.distributed.checkpoint")
        and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
    )


def _enum_member(cls: Any, name: Any) -> enum.Enum:
    """``getattr(cls, name)`` for a DCP enum and one of its members' names; an ``UnpicklingError`` for anything else."""
    if (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and _is_dcp_type(cls)
        and isinstance(name, str)
        and name in cls.__members__
    ):
        return cls.__members__[name]
    raise pickle.UnpicklingError(
        f"DCP metadata applies getattr to {getattr(cls, '__qualname__', type(cls).__name__)}.{name!r}, "
        "which is not a member of a DCP enum: refused"
    )


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
        _check_metadata(meta)
    except _Bad as exc:
        return str(exc)
    return None


def _check_metadata(meta: Metadata) -> None:
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
    transforms = _field(
        info, "transform_descriptors", (list, tuple, type(None)), f"the transform_descriptors of {where}"
    )
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
        offsets = _ints(
            _field(chunk, "offsets", (torch.Size, tuple), f"the offsets of a chunk of {where}"),
            f"the offsets of a chunk of {where}",
        )
        sizes = _ints(
            _field(chunk, "sizes", (torch.Size, tuple), f"the sizes of a chunk of {where}"),
            f"the sizes of a chunk of {where}",
        )
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
        raise _Bad(
            f"lists chunks of {where} holding {total:,} elements where its size {shown(list(size))} has "
            f"{math.prod(size):,}"
        )


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


NO_GROUP_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


_METADATA = ".metadata"


_NOT_OURS = "pimm_fn never unpickles objects from a checkpoint, so nothing of it was run"


_ALTERED = "(the checkpoint was not written by pimm_fn, or was altered)"


def metadata(directory: str | os.PathLike[str] | storage.StorePath, within: str = files.TRAINER) -> Metadata:
    """The DCP metadata of ``directory/within``, read safely.

    Raises:
        CheckpointError: ``.metadata`` is missing, does not unpickle with
            :class:`MetadataUnpickler`, holds a field of another type or shape
            than DCP writes (:mod:`pimm_fn.checkpoint.formats.dcp_reading`), or names a data file
            outside its directory.
    """
    directory = storage.location(directory)
    name = _name(within, _METADATA)
    try:
        with (directory / within / _METADATA).open("rb") as stream:  # a local Path or a StorePath alike
            found = MetadataUnpickler(stream).load()
    except FileNotFoundError:
        raise CheckpointError(directory, name, "is missing") from None
    except Exception as exc:  # noqa: BLE001 - a damaged or hostile pickle raises many types
        raise CheckpointError(directory, name, f"does not load ({cause(exc)})") from None
    if not isinstance(found, Metadata):
        raise CheckpointError(directory, name, f"does not hold DCP metadata (got {type(found).__name__})")
    wrong = problem(found)  # every field of the type DCP writes: what follows may trust them
    if wrong is not None:
        raise CheckpointError(directory, name, f"{wrong} {_ALTERED}")
    _check_files(directory, name, found)
    if getattr(found, "storage_meta", None) is None:
        found.storage_meta = StorageMeta()
    return found


def load(
    template: dict,
    directory: str | os.PathLike[str] | storage.StorePath,
    *,
    within: str = files.TRAINER,
    meta: Metadata | None = None,
    collective: bool = False,
    plain_values: bool = False,
) -> None:
    """Read ``directory/within``'s entry for every key of ``template`` into it, in place.

    Args:
        template: key -> a tensor (plain, ``DTensor``) to read into; with
            ``plain_values``, ``None`` for an entry DCP pickled (a plain value).
        meta: the metadata :func:`metadata` read, when the caller already has it.
        collective: every rank of the process group calls (a sharded model's
            shards); else this process reads alone.
        plain_values: read pickled entries with ``torch.load(weights_only=True)``
            (pimm's payloads); pimm_fn's own checkpoints hold none.

    Raises:
        CheckpointError: an entry is missing, pickled where a tensor is
            expected, of another shape or dtype, or a plain value does not
            load safely; on every rank, before any data is read (but a
            plain value, refused as it is read).
        CheckpointException: DCP could not read a data file (missing, cut short).
    """
    directory = storage.location(directory)
    meta = meta if meta is not None else metadata(directory, within)
    where = _Where(directory, within)
    _check(where, template, meta, plain_values)
    inside = directory / within
    reader = _StoreReader(inside, meta) if storage.is_store(inside) else _Reader(inside, meta)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=NO_GROUP_WARNING)
            dcp.load(template, storage_reader=reader, planner=_Planner(where, plain_values), no_dist=not collective)
    except CheckpointException as exc:  # a refusal raised inside DCP comes out as itself
        ours = _refusal(exc)
        if ours is not None:
            raise ours from None
        raise


def empty(
    entry: TensorStorageMetadata,
    directory: str | os.PathLike[str] | storage.StorePath,
    key: str,
    within: str = files.TRAINER,
) -> torch.Tensor:
    """An uninitialized tensor of the shape and dtype ``entry`` (of ``directory/within``'s metadata) lists for ``key``.

    Raises:
        CheckpointError: this process cannot allocate it (a size a damaged or
            crafted checkpoint claims), naming ``.metadata`` and the entry.
    """
    try:
        return torch.empty(entry.size, dtype=entry.properties.dtype)
    except (RuntimeError, MemoryError) as exc:  # torch's allocator refuses, or a dtype torch.empty does not make
        problem = f"lists {key!r} as a {_shown(entry.properties.dtype, entry.size)} tensor, which cannot be made here"
        raise CheckpointError(
            storage.location(directory), _name(within, _METADATA), f"{problem} ({cause(exc)}) {_ALTERED}"
        ) from None


@dataclasses.dataclass(frozen=True)
class _Where:
    """The checkpoint a read is from, and its DCP directory relative to it (``""``: itself)."""

    directory: storage.Location
    within: str

    def error(self, file: str, problem: str) -> CheckpointError:
        return CheckpointError(self.directory, _name(self.within, file), problem)


def _name(within: str, file: str) -> str:
    return f"{within}/{file}" if within else file


def _check_files(directory: storage.Location, name: str, meta: Metadata) -> None:
    """Every data file the metadata names is a plain name inside its directory (no path, no ``..``)."""
    for info in meta.storage_data.values():  # a dict of _StorageInfo: metadata_checks
        file = info.relative_path
        if not isinstance(file, str) or not file or "/" in file or "\\" in file or file in (".", ".."):
            raise CheckpointError(directory, name, f"names the data file {file!r}, outside its directory {_ALTERED}")


def _check(where: _Where, template: dict, meta: Metadata, plain_values: bool) -> None:
    """Every key of ``template`` is listed as what it expects: the same tensor, or (plain values) a pickled value."""
    listed = meta.state_dict_metadata
    for key, value in template.items():
        entry = listed.get(key)
        if entry is None:
            raise where.error(_METADATA, f"lists no entry {key!r}, which this read needs {_ALTERED}")
        if isinstance(entry, BytesStorageMetadata):
            if plain_values and value is None:
                continue
            raise where.error(
                _METADATA, f"lists {key!r} as a pickled object where a tensor is expected: {_NOT_OURS} {_ALTERED}"
            )
        if not isinstance(entry, TensorStorageMetadata):
            problem = f"lists {key!r} as a {type(entry).__name__}, which DCP never writes: {_NOT_OURS}"
            raise where.error(_METADATA, problem)
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"safe_reading.load: template[{key!r}] must be a tensor (got {type(value).__name__})")
        saved, wanted = (entry.properties.dtype, tuple(entry.size)), (value.dtype, tuple(value.size()))
        if saved != wanted:
            raise where.error(
                _METADATA,
                f"holds {key!r} as a {_shown(*saved)} tensor where this run expects "
                f"{_shown(*wanted)} (written by another model, or altered)",
            )


def _shown(dtype: torch.dtype, shape: tuple) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def _refusal(exc: CheckpointException) -> CheckpointError | None:
    for failure in exc.failures.values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, CheckpointError):
            return inner
    return None


class _Guarded(dcp.FileSystemReader):
    """A DCP reader over metadata read by :func:`metadata`, which reads data for :class:`_Planner` only.

    Both readers it guards are ``FileSystemReader``-s (DCP's ``FsspecReader`` is one).
    """

    def __init__(self, path: str | os.PathLike[str], meta: Metadata):
        super().__init__(path)
        self._pimm_metadata = meta

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        meta = self._pimm_metadata
        if meta.storage_meta is None:  # metadata() gave it one; a Metadata read elsewhere may have none, as in DCP
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta

    def read_data(self, plan, planner):
        if not isinstance(planner, _Planner):  # DCP's default planner unpickles pickled entries
            raise TypeError("pimm_fn's DCP reader reads for pimm_fn.checkpoint.formats.dcp_reading's planner only")
        return super().read_data(plan, planner)


class _Reader(_Guarded, dcp.FileSystemReader):
    """DCP's ``FileSystemReader`` (a local checkpoint), guarded."""


class _StoreReader(_Guarded, FsspecReader):
    """DCP's fsspec reader (a checkpoint on a store: ``pimm_fn.checkpoint.storage``), guarded, reading in file order."""

    def __init__(self, path: "storage.StorePath", meta: Metadata):
        super().__init__(path.url, meta)

    def read_data(self, plan, planner):
        # In file order: DCP reads in plan order, and each seek back makes the store's read-ahead fetch again.
        where = lambda item: (
            self.storage_data[item.storage_index].relative_path,
            self.storage_data[item.storage_index].offset,
        )
        return super().read_data(dataclasses.replace(plan, items=sorted(plan.items, key=where)), planner)


class _Planner(DefaultLoadPlanner):
    """DCP's planner over a flat template, which reads a pickled entry only as a plain value, and only when asked."""

    def __init__(self, where: _Where, plain_values: bool):
        super().__init__(flatten_state_dict=False)
        self._where, self._plain_values = where, plain_values

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        _check(self._where, state_dict, metadata, self._plain_values)  # again, as DCP sees them: nothing bypasses it
        super().set_up_planner(state_dict, metadata, is_coordinator)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        if not self._plain_values:
            raise self._where.error(_METADATA, f"lists {key!r} as a pickled object: {_NOT_OURS} {_ALTERED}")
        self.original_state_dict[key] = _plain_value(self._where, key, value)  # the caller's template itself


def _plain_value(where: _Where, key: str, value: io.BytesIO) -> Any:
    """A pickled entry read by torch's restricted unpickler: containers, numbers, strings, tensors, numpy arrays."""
    try:
        with torch.serialization.safe_globals(plain_globals()):
            return torch.load(value, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for unsafe or bad bytes
        raise where.error(
            _METADATA,
            f"lists {key!r}, a pickled value that does not load with "
            f"torch.load(weights_only=True) ({cause(exc)}): {_NOT_OURS} {_ALTERED}",
        ) from None


def plain_globals() -> list:
    """The numpy reconstructors a plain value may name beside torch's own (pimm's RNG state holds an ndarray)."""
    import numpy as np  # noqa: PLC0415 - numpy is needed for pimm's payloads only

    core = getattr(np, "_core", None) or np.core
    found = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
    return found + [getattr(np.dtypes, n) for n in dir(getattr(np, "dtypes", None) or ()) if n.endswith("DType")]
