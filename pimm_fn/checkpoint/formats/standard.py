"""The trainer part of a standard checkpoint: tensors in a DCP directory.

``torch.distributed.checkpoint`` (DCP) stores a flat dict of tensors. Each
part of the trainer state is :func:`~pimm_fn.checkpoint.formats.pack.pack`-ed into a skeleton (kept as
a ``uint8`` tensor) and its tensors, under these keys::

    trainer/skeleton, trainer/t/<i>                  replicated: DCP writes once
    local/rank<r>/skeleton, local/rank<r>/t/<i>      one set per rank

Distinct per-rank keys keep DCP from de-duplicating rank-local data (RNG
states differ per rank but have equal shapes). Loading allocates tensors from
the DCP metadata, so no template state is needed, and reads through
:mod:`pimm_fn.checkpoint.formats.dcp_reading`, which never unpickles an object.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from pimm_fn import dist
from pimm_fn.checkpoint import files as L
from pimm_fn.checkpoint import publish, storage
from pimm_fn.checkpoint.errors import CheckpointError, cause, no_space, storage_errors, tensor_bytes
from pimm_fn.checkpoint.formats import dcp_reading
from pimm_fn.checkpoint.formats.pack import pack, skeleton_to_tensor, tensor_to_skeleton, unpack

_SKELETON = "skeleton"
_METADATA = f"{L.TRAINER}/.metadata"
_NO_GROUP_WARNING = dcp_reading.NO_GROUP_WARNING


def write_trainer(directory: storage.Location, trainer: dict, local: dict) -> None:
    """Collectively write ``trainer`` (replicated) and this rank's ``local``.

    Raises:
        TypeError / ValueError: on every rank, when some rank's state cannot
            be packed, or the replicated part differs between ranks.
    """
    write_state(directory, packed_state(trainer, local))


def write_state(directory: storage.Location, state: dict[str, torch.Tensor], group=None) -> None:
    """Collectively write a :func:`packed_state` into ``directory/trainer`` with DCP.

    DCP fsyncs each file it writes (``sync_files``), then writes its
    ``.metadata`` last, also fsynced; the caller fsyncs the directories.
    Every rank's receipt is checked afterwards (``CheckpointStorageError``).

    Raises:
        DiskFullError / CheckpointStorageError: on every rank, when some
            rank's write ran out of space, or failed otherwise.
    """
    publish.write_receipt(directory)
    with (
        warnings.catch_warnings(),
        storage_errors(
            directory.parent, lambda: tensor_bytes(state), "this rank's trainer state", publish.removed(directory)
        ),
    ):
        warnings.filterwarnings("ignore", message=_NO_GROUP_WARNING)
        dcp.save(state, storage_writer=_writer(directory / L.TRAINER), process_group=group)
    publish.check_receipts(directory, group)


class _NoSpaceReported(dcp.FileSystemWriter):
    """DCP writers whose full-disk failures reach every rank as ENOSPC.

    DCP pickles each rank's failure to share it, which drops the chained
    ``OSError`` behind torch.save's ``unexpected pos``; the ``OSError`` itself is sent instead.
    Both writers it serves are ``FileSystemWriter``-s (DCP's ``FsspecWriter`` is one).
    """

    def write_data(self, plan, planner):
        try:
            return super().write_data(plan, planner)
        except Exception as exc:
            raise no_space(exc) or exc

    def finish(self, metadata, results) -> None:
        try:
            return super().finish(metadata, results)
        except Exception as exc:
            raise no_space(exc) or exc


class _Writer(_NoSpaceReported, dcp.FileSystemWriter):
    """A ``FileSystemWriter`` (a local save_dir) with :class:`_NoSpaceReported`'s errors."""


class _StoreWriter(_NoSpaceReported, FsspecWriter):
    """DCP's fsspec writer (a save_dir on a store: ``pimm_fn.checkpoint.storage``), with the same errors."""


def _writer(trainer_dir: storage.Location) -> dcp.FileSystemWriter:
    """The DCP writer for ``trainer_dir``: the local one, or DCP's fsspec writer on a store."""
    if storage.is_store(trainer_dir):
        return _StoreWriter(trainer_dir.url, sync_files=True)
    return _Writer(trainer_dir, sync_files=True)


def packed_state(trainer: dict, local: dict) -> dict[str, torch.Tensor]:
    """The flat tensor dict DCP writes: packed ``trainer`` and this rank's ``local``.

    Collective in a process group (the agreement check). Plain values are
    frozen into the JSON skeletons now; tensors are referenced, not copied.
    """
    try:
        state = flat_state(trainer, local)
        replicated = {k: v for k, v in state.items() if k.startswith("trainer/")}
        problem = None
    except (TypeError, ValueError) as exc:
        replicated, state, problem = {}, {}, exc
    _agree(replicated, problem)
    return state


def flat_state(trainer: dict, local: dict) -> dict[str, torch.Tensor]:
    """:func:`packed_state` without the agreement check: this rank's keys and tensors, no collective."""
    return {**_flatten("trainer", trainer), **_flatten(f"local/rank{dist.rank()}", local)}


def read_trainer(directory: storage.Location, rank: int) -> tuple[dict, dict | None]:
    """Collectively read the replicated part and rank ``rank``'s local part.

    Returns:
        ``(trainer, local)``; ``local`` is ``None`` when the checkpoint has no
        entry for ``rank`` (it was written by fewer ranks).

    Raises:
        CheckpointError: a file of ``trainer/`` is missing, cut short or
            overwritten (naming it), or holds what pimm_fn never writes.
    """
    meta = metadata(directory)
    prefixes = {"trainer": "trainer", "local": f"local/rank{rank}"}
    if f"trainer/{_SKELETON}" not in meta.state_dict_metadata:
        problem = f"names no 'trainer/{_SKELETON}': this DCP directory was not written by pimm_fn"
        raise CheckpointError(directory, _METADATA, problem)
    state: dict[str, torch.Tensor] = {}
    for key, entry in meta.state_dict_metadata.items():
        if not any(key.startswith(p + "/") for p in prefixes.values()):
            continue
        if not isinstance(entry, TensorStorageMetadata):
            problem = f"lists {key!r} as a non-tensor entry, which pimm_fn never writes; refusing to load it"
            raise CheckpointError(directory, _METADATA, problem)
        state[key] = dcp_reading.empty(entry, directory, key)
    try:
        dcp_reading.load(state, directory, meta=meta)  # each rank its own entries, no collective
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as exc:
        damaged = failing_file(directory, meta, state)
        raise CheckpointError(directory, damaged, f"does not read back ({cause(exc)})") from None
    trainer = _unpacked(directory, meta, prefixes["trainer"], state)
    has_local = f"{prefixes['local']}/{_SKELETON}" in state
    return trainer, _unpacked(directory, meta, prefixes["local"], state) if has_local else None


def metadata(directory: storage.Location) -> Metadata:
    """The DCP metadata of a checkpoint's ``trainer/``, read safely; a ``CheckpointError`` when it does not load."""
    return dcp_reading.metadata(directory)


def damaged_file(directory: storage.Location, meta: Metadata, keys) -> str:
    """The data file holding ``keys`` that is missing or shorter than the metadata says; else the first one."""
    files = _files_of(meta, keys)
    return next((name for name in files if _short(directory, meta, name)), files[0] if files else _METADATA)


def failing_file(directory: storage.Location, meta: Metadata, state: dict[str, torch.Tensor]) -> str:
    """After a failed read of ``state``: the data file that is short, else the first whose entries fail read alone."""
    files = _files_of(meta, state)
    if any(_short(directory, meta, name) for name in files):
        return damaged_file(directory, meta, state)
    for name in files:
        part = {k: torch.empty_like(state[k]) for k in state if f"{L.TRAINER}/{_home(meta).get(k)}" == name}
        try:
            dcp_reading.load(part, directory, meta=meta)
        except (Exception, CheckpointException):
            return name
    return files[0] if files else _METADATA


def _home(meta: Metadata) -> dict[str, str]:
    """``{key: the data file holding it}`` (relative to ``trainer/``)."""
    return {index.fqn: info.relative_path for index, info in meta.storage_data.items()}  # types: metadata_checks


def _files_of(meta: Metadata, keys) -> list[str]:
    home = _home(meta)
    return sorted({f"{L.TRAINER}/{home[k]}" for k in keys if k in home})


def _short(directory: storage.Location, meta: Metadata, name: str) -> bool:
    needed = max(i.offset + i.length for i in meta.storage_data.values() if f"{L.TRAINER}/{i.relative_path}" == name)
    path = directory / name
    return not path.is_file() or path.stat().st_size < needed


def _unpacked(directory: storage.Location, meta: Metadata, prefix: str, state: dict[str, torch.Tensor]) -> Any:
    try:
        return _unflatten(prefix, state)
    except Exception as exc:  # noqa: BLE001 - overwritten bytes fail in JSON, in unicode, in a lookup
        problem = f"holds a {prefix} part that does not unpack ({cause(exc)}): its bytes were overwritten"
        raise CheckpointError(directory, damaged_file(directory, meta, [f"{prefix}/{_SKELETON}"]), problem) from None


def _flatten(prefix: str, obj: Any) -> dict[str, torch.Tensor]:
    skeleton, tensors = pack(obj)
    out = {f"{prefix}/{_SKELETON}": skeleton_to_tensor(skeleton)}
    out.update({f"{prefix}/t/{k}": v for k, v in tensors.items()})
    return out


def _unflatten(prefix: str, state: dict[str, torch.Tensor]) -> Any:
    head = f"{prefix}/t/"
    tensors = {k[len(head) :]: v for k, v in state.items() if k.startswith(head)}
    return unpack(tensor_to_skeleton(state[f"{prefix}/{_SKELETON}"]), tensors)


def _agree(replicated: dict[str, torch.Tensor], problem: Exception | None) -> None:
    # One all-gather before DCP's collectives: a rank that cannot pack its
    # state must not leave the others waiting inside dcp.save. Replicated
    # keys are written by one rank only (DCP de-duplicates them), so ranks
    # that disagree on them would silently lose data: refuse instead.
    if not dist.is_initialized():
        if problem is not None:
            raise problem
        return
    digest = hashlib.sha256()
    for key, tensor in replicated.items():
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
    if replicated:
        digest.update(tensor_to_skeleton(replicated[f"trainer/{_SKELETON}"]).encode())
    reports = dist.all_gather_object(
        (digest.hexdigest(), None if problem is None else f"{type(problem).__name__}: {problem}")
    )
    if problem is not None:
        raise problem
    failed = [(r, msg) for r, (_, msg) in enumerate(reports) if msg is not None]
    if failed:
        raise ValueError(f"save_checkpoint: rank {failed[0][0]} could not pack its state: {failed[0][1]}")
    differ = [r for r, (d, _) in enumerate(reports) if d != reports[0][0]]
    if differ:
        raise ValueError(
            f"save_checkpoint: 'trainer' must be identical on every rank, but ranks {differ} differ from rank 0 "
            "in structure, shapes or plain values; move rank-specific values into 'local'"
        )
