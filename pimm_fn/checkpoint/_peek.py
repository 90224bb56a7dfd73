"""What a checkpoint holds, read without its tensors: for listing and inspecting from the shell.

The trainer part is a packed tree (``_pack``): a JSON skeleton that names
its tensors. Reading the skeleton alone, with a :class:`TensorInfo` (shape,
dtype, bytes: from DCP's metadata, or from a legacy file mapped, not read)
in place of each tensor, gives the whole tree — progress, metrics, hook
slots, optimizer hyper-parameters — at the cost of a few kilobytes, whatever
the model's size. ``contents_of`` turns it into the ``TrainerContents`` the
loader would build (``local`` left out).
"""

from __future__ import annotations

import json
import pathlib

import attrs
import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from . import _layout as L
from . import storage
from . import _legacy, safe_reading
from ._pack import tensor_to_skeleton, unpack
from .contents import TrainerContents, from_parts

__all__ = [
    "TensorInfo", "trainer_without_tensors", "contents_of", "tensor_infos", "infos_of", "numpy_keys",
    "weights_without_tensors", "size_of",
]


@attrs.frozen
class TensorInfo:
    """A tensor of a checkpoint, not read: its dtype, shape and size in bytes."""

    dtype: str
    shape: tuple
    nbytes: int

    def __repr__(self):
        return f"tensor({self.dtype}, {list(self.shape)})"


def _info(dtype: torch.dtype, shape) -> TensorInfo:
    numel = 1
    for n in shape:
        numel *= int(n)
    return TensorInfo(str(dtype).removeprefix("torch."), tuple(int(n) for n in shape), numel * dtype.itemsize)


def tensor_infos(path: pathlib.Path) -> dict[str, TensorInfo]:
    """Every tensor entry of a standard checkpoint's ``trainer/`` DCP directory, from its metadata alone."""
    return infos_of(safe_reading.metadata(path).state_dict_metadata)


def infos_of(meta: dict) -> dict[str, TensorInfo]:
    """Each tensor entry of DCP metadata (``state_dict_metadata``) as a :class:`TensorInfo`."""
    return {k: _info(e.properties.dtype, e.size) for k, e in meta.items() if isinstance(e, TensorStorageMetadata)}


def numpy_keys(skeleton: str) -> set[str]:
    """The tensors a skeleton stores numpy values in: those must be read, as ``unpack`` needs their bytes."""
    return _ndarray_keys(json.loads(skeleton))


def _ndarray_keys(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["ndarray"]} if "ndarray" in node else set()
        return found.union(*(_ndarray_keys(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_ndarray_keys(v) for v in node))
    return set()


def trainer_without_tensors(path: pathlib.Path) -> dict:
    """The replicated trainer part of a checkpoint (directory or legacy file), its tensors as :class:`TensorInfo`.

    Raises:
        ValueError / OSError: the trainer part is missing or unreadable.
    """
    if path.is_file():
        packed = _legacy._load(path, mmap=True)["trainer"]  # mapped: no tensor byte is read
        skeleton, stored = packed["skeleton"], packed["tensors"]
        infos = {k: _info(t.dtype, t.shape) for k, t in stored.items()}
        needed = {k: stored[k] for k in numpy_keys(skeleton)}
        return unpack(skeleton, {**infos, **needed})
    meta = safe_reading.metadata(path).state_dict_metadata
    if not isinstance(meta.get("trainer/skeleton"), TensorStorageMetadata):
        raise ValueError(f"{path / L.TRAINER} has no 'trainer/skeleton' tensor: not written by pimm_fn")
    head = {"trainer/skeleton": safe_reading.empty(meta["trainer/skeleton"], path, "trainer/skeleton")}
    _read(path, head)
    skeleton = tensor_to_skeleton(head["trainer/skeleton"])
    infos = {k.removeprefix("trainer/t/"): v for k, v in infos_of(meta).items() if k.startswith("trainer/t/")}
    needed = {f"trainer/t/{k}": safe_reading.empty(meta[f"trainer/t/{k}"], path, f"trainer/t/{k}")
              for k in numpy_keys(skeleton)}
    _read(path, needed)
    needed = {k.removeprefix("trainer/t/"): v for k, v in needed.items()}
    return unpack(skeleton, {**infos, **needed})


def _read(path: pathlib.Path, state: dict) -> None:
    """Read the entries of ``state`` (and only those) from a standard checkpoint's DCP directory, in place."""
    if state:
        safe_reading.load(state, path)


def contents_of(path: pathlib.Path) -> TrainerContents:
    """The checkpoint's ``TrainerContents`` (no local part), its tensors as :class:`TensorInfo`."""
    return from_parts(trainer_without_tensors(path), None)


def size_of(path: pathlib.Path) -> int:
    """Bytes on disk of a file, or of every file under a directory (hard-linked snapshots count in full)."""
    if path.is_file():
        return path.stat().st_size
    if storage.is_store(path):
        return sum(path.files().values())
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def weights_without_tensors(path: pathlib.Path) -> dict[str, TensorInfo]:
    """The model weights a checkpoint holds, as :class:`TensorInfo` by name (mapped, not read).

    A sharded model saved without ``model.pth`` gives its shards' full shapes.

    Raises:
        CheckpointError: the weights read are not a state_dict (``_legacy.weights_problem``).
    """
    if path.is_dir() and (path / L.WEIGHTS_SKIPPED).is_file():
        prefix = "sharded/model/"
        return {k.removeprefix(prefix): v for k, v in tensor_infos(path).items() if k.startswith(prefix)}
    if path.is_dir():
        weights = _legacy.checked_weights(_legacy._load(path / L.WEIGHTS, mmap=True), path, L.WEIGHTS)
    else:
        content = _legacy._load(path, mmap=True)
        weights = content.get("weights", content) if isinstance(content, dict) else {}
        if isinstance(content, dict) and "weights" in content:  # a legacy checkpoint's: a state_dict, or damaged
            weights = _legacy.checked_weights(weights, path, path.name)
    return {k: _info(v.dtype, v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
