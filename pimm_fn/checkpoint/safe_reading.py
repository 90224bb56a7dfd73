"""The one way pimm_fn reads a ``torch.distributed.checkpoint`` (DCP) directory: never running code from it.

A DCP directory is untrusted input. DCP pickles its metadata (``.metadata``)
and every entry that is not a tensor (``BytesStorageMetadata``), and its
default load planner reads such an entry with ``torch.load(weights_only=False)``,
which runs whatever the bytes say: a checkpoint listing a pickled object
where the reader expects a tensor would choose to run code.

Every DCP read of pimm_fn goes through the two functions here (a test scans
the package for any other ``dcp.load`` or ``FileSystemReader``):

- :func:`metadata` unpickles ``.metadata`` with :class:`.metadata_unpickler.MetadataUnpickler`,
  which admits DCP's own metadata classes and the torch and standard types
  they hold, as CPython 3.10-3.13 pickle them, and nothing else; every field
  must then be of the type DCP writes (:mod:`.metadata_checks`), and the data
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
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta, TensorStorageMetadata

from . import _layout as L
from . import metadata_checks, storage
from .errors import CheckpointError, cause
from .metadata_unpickler import MetadataUnpickler

__all__ = ["metadata", "load", "empty", "plain_globals"]

NO_GROUP_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
_METADATA = ".metadata"
_NOT_OURS = "pimm_fn never unpickles objects from a checkpoint, so nothing of it was run"
_ALTERED = "(the checkpoint was not written by pimm_fn, or was altered)"


def metadata(directory: pathlib.Path, within: str = L.TRAINER) -> Metadata:
    """The DCP metadata of ``directory/within``, read safely.

    Raises:
        CheckpointError: ``.metadata`` is missing, does not unpickle with
            :class:`MetadataUnpickler`, holds a field of another type or shape
            than DCP writes (:mod:`.metadata_checks`), or names a data file
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
    wrong = metadata_checks.problem(found)  # every field of the type DCP writes: what follows may trust them
    if wrong is not None:
        raise CheckpointError(directory, name, f"{wrong} {_ALTERED}")
    _check_files(directory, name, found)
    if getattr(found, "storage_meta", None) is None:
        found.storage_meta = StorageMeta()
    return found


def load(template: dict, directory: pathlib.Path, *, within: str = L.TRAINER, meta: Metadata | None = None,
         collective: bool = False, plain_values: bool = False) -> None:
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


def empty(entry: TensorStorageMetadata, directory: pathlib.Path, key: str, within: str = L.TRAINER) -> torch.Tensor:
    """An uninitialized tensor of the shape and dtype ``entry`` (of ``directory/within``'s metadata) lists for ``key``.

    Raises:
        CheckpointError: this process cannot allocate it (a size a damaged or
            crafted checkpoint claims), naming ``.metadata`` and the entry.
    """
    try:
        return torch.empty(entry.size, dtype=entry.properties.dtype)
    except (RuntimeError, MemoryError) as exc:  # torch's allocator refuses, or a dtype torch.empty does not make
        problem = f"lists {key!r} as a {_shown(entry.properties.dtype, entry.size)} tensor, which cannot be made here"
        raise CheckpointError(storage.location(directory), _name(within, _METADATA),
                              f"{problem} ({cause(exc)}) {_ALTERED}") from None


@dataclasses.dataclass(frozen=True)
class _Where:
    """The checkpoint a read is from, and its DCP directory relative to it (``""``: itself)."""

    directory: pathlib.Path
    within: str

    def error(self, file: str, problem: str) -> CheckpointError:
        return CheckpointError(self.directory, _name(self.within, file), problem)


def _name(within: str, file: str) -> str:
    return f"{within}/{file}" if within else file


def _check_files(directory: pathlib.Path, name: str, meta: Metadata) -> None:
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
            raise where.error(_METADATA, f"lists {key!r} as a pickled object where a tensor is expected: "
                                         f"{_NOT_OURS} {_ALTERED}")
        if not isinstance(entry, TensorStorageMetadata):
            problem = f"lists {key!r} as a {type(entry).__name__}, which DCP never writes: {_NOT_OURS}"
            raise where.error(_METADATA, problem)
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"safe_reading.load: template[{key!r}] must be a tensor (got {type(value).__name__})")
        saved, wanted = (entry.properties.dtype, tuple(entry.size)), (value.dtype, tuple(value.size()))
        if saved != wanted:
            raise where.error(_METADATA, f"holds {key!r} as a {_shown(*saved)} tensor where this run expects "
                                         f"{_shown(*wanted)} (written by another model, or altered)")


def _shown(dtype: torch.dtype, shape: tuple) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def _refusal(exc: CheckpointException) -> CheckpointError | None:
    for failure in exc.failures.values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, CheckpointError):
            return inner
    return None


class _Guarded:
    """A DCP reader over metadata read by :func:`metadata`, which reads data for :class:`_Planner` only."""

    def __init__(self, path, meta: Metadata):
        super().__init__(path)
        self._pimm_metadata = meta

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self._pimm_metadata.storage_meta.load_id = self.load_id
        return self._pimm_metadata

    def read_data(self, plan, planner):
        if not isinstance(planner, _Planner):  # DCP's default planner unpickles pickled entries
            raise TypeError("pimm_fn's DCP reader reads for pimm_fn.checkpoint.safe_reading's planner only")
        return super().read_data(plan, planner)


class _Reader(_Guarded, dcp.FileSystemReader):
    """DCP's ``FileSystemReader`` (a local checkpoint), guarded."""


class _StoreReader(_Guarded, FsspecReader):
    """DCP's fsspec reader (a checkpoint on a store: ``pimm_fn.checkpoint.storage``), guarded, reading in file order."""

    def __init__(self, path: "storage.StorePath", meta: Metadata):
        super().__init__(path.url, meta)

    def read_data(self, plan, planner):
        # In file order: DCP reads in plan order, and each seek back makes the store's read-ahead fetch again.
        where = lambda item: (self.storage_data[item.storage_index].relative_path,
                              self.storage_data[item.storage_index].offset)
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
        raise where.error(_METADATA, f"lists {key!r}, a pickled value that does not load with "
                                     f"torch.load(weights_only=True) ({cause(exc)}): {_NOT_OURS} {_ALTERED}") from None


def plain_globals() -> list:
    """The numpy reconstructors a plain value may name beside torch's own (pimm's RNG state holds an ndarray)."""
    import numpy as np  # noqa: PLC0415 - numpy is needed for pimm's payloads only

    core = getattr(np, "_core", None) or np.core
    found = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
    return found + [getattr(np.dtypes, n) for n in dir(getattr(np, "dtypes", None) or ()) if n.endswith("DType")]
