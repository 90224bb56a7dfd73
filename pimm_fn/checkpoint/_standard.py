"""The trainer part of a standard checkpoint: tensors in a DCP directory.

``torch.distributed.checkpoint`` (DCP) stores a flat dict of tensors. Each
part of the trainer state is :func:`~._pack.pack`-ed into a skeleton (kept as
a ``uint8`` tensor) and its tensors, under these keys::

    trainer/skeleton, trainer/t/<i>                  replicated: DCP writes once
    local/rank<r>/skeleton, local/rank<r>/t/<i>      one set per rank

Distinct per-rank keys keep DCP from de-duplicating rank-local data (RNG
states differ per rank but have equal shapes). Loading allocates tensors from
the DCP metadata, so no template state is needed, and reads that metadata
with an unpickler that only admits DCP's own metadata classes.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import pathlib
import pickle
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from . import _layout as L
from . import _publish, dist
from ._pack import pack, skeleton_to_tensor, tensor_to_skeleton, unpack

_SKELETON = "skeleton"
_NO_GROUP_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


def write_trainer(directory: pathlib.Path, trainer: dict, local: dict) -> None:
    """Collectively write ``trainer`` (replicated) and this rank's ``local``.

    Raises:
        TypeError / ValueError: on every rank, when some rank's state cannot
            be packed, or the replicated part differs between ranks.
    """
    write_state(directory, packed_state(trainer, local))


def write_state(directory: pathlib.Path, state: dict[str, torch.Tensor], group=None) -> None:
    """Collectively write a :func:`packed_state` into ``directory/trainer`` with DCP.

    DCP fsyncs each file it writes (``sync_files``), then writes its
    ``.metadata`` last, also fsynced; the caller fsyncs the directories.
    Every rank's receipt is checked afterwards (``CheckpointStorageError``).
    """
    _publish.write_receipt(directory)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_GROUP_WARNING)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(directory / L.TRAINER, sync_files=True), process_group=group)
    _publish.check_receipts(directory, group)


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


def read_trainer(directory: pathlib.Path, rank: int) -> tuple[dict, dict | None]:
    """Collectively read the replicated part and rank ``rank``'s local part.

    Returns:
        ``(trainer, local)``; ``local`` is ``None`` when the checkpoint has no
        entry for ``rank`` (it was written by fewer ranks).
    """
    path = directory / L.TRAINER
    reader = _SafeReader(path)
    meta = reader.read_metadata().state_dict_metadata
    prefixes = {"trainer": "trainer", "local": f"local/rank{rank}"}
    if f"trainer/{_SKELETON}" not in meta:
        raise ValueError(f"{path} is a DCP directory without 'trainer/{_SKELETON}': not written by pimm_fn")
    state: dict[str, torch.Tensor] = {}
    for key, entry in meta.items():
        if not any(key.startswith(p + "/") for p in prefixes.values()):
            continue
        if not isinstance(entry, TensorStorageMetadata):
            raise ValueError(f"{path}: entry {key!r} is not a tensor; pimm_fn only writes tensors, refusing to load it")
        state[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_GROUP_WARNING)
        dcp.load(state, storage_reader=reader, no_dist=True)  # each rank its own entries, no collective
    trainer = _unflatten(prefixes["trainer"], state)
    has_local = f"{prefixes['local']}/{_SKELETON}" in state
    return trainer, _unflatten(prefixes["local"], state) if has_local else None


def _flatten(prefix: str, obj: Any) -> dict[str, torch.Tensor]:
    skeleton, tensors = pack(obj)
    out = {f"{prefix}/{_SKELETON}": skeleton_to_tensor(skeleton)}
    out.update({f"{prefix}/t/{k}": v for k, v in tensors.items()})
    return out


def _unflatten(prefix: str, state: dict[str, torch.Tensor]) -> Any:
    head = f"{prefix}/t/"
    tensors = {k[len(head):]: v for k, v in state.items() if k.startswith(head)}
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
    reports = dist.all_gather_object((digest.hexdigest(), None if problem is None else f"{type(problem).__name__}: {problem}"))
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


class _SafeReader(dcp.FileSystemReader):
    """A ``FileSystemReader`` whose metadata unpickler admits only DCP's own types."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata, unpickled safely, read once per reader."""
        cached = self.__dict__.get("_pimm_metadata")
        if cached is not None:
            return cached
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise ValueError(f"{path} does not hold DCP metadata (got {type(metadata).__name__})")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        self._pimm_metadata = metadata
        return metadata


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint"):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                return obj
        elif module == "torch.serialization" and name == "_get_layout":  # layout name -> torch.layout
            return super().find_class(module, name)
        elif module == "torch":
            obj = getattr(torch, name, None)
            if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        elif module == "pathlib" and name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
            return super().find_class(module, name)
        elif module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"DCP metadata references {module}.{name}, which is not allowed to load")
