"""The legacy one-file format: ``last.pth`` written by the main rank.

The file is a ``torch.save`` of a dict holding only strings, plain
containers and tensors, so ``torch.load(weights_only=True)`` reads it::

    {"marker": {"step", "format": "legacy", "world_size", "version"},
     "weights": <model state_dict>,
     "trainer": {"skeleton": str, "tensors": {...}},
     "local": [{"skeleton": str, "tensors": {...}}, ...]   # one per rank}

Trainer and local state go through :func:`~._pack.pack` as in the standard
format, so both formats restore exactly the same Python values.
"""

from __future__ import annotations

import io
import pathlib
import zipfile
from collections.abc import Mapping
from typing import Any

import torch

from . import _safe_writes as W
from . import storage
from ._marker import CheckpointInfo, info_from_marker, marker_payload
from ._pack import pack, unpack
from .errors import CheckpointError, cause, shown, storage_errors, tensor_bytes

EXTRA_STATE = "_extra_state"  # torch's suffix for a module's get_extra_state() entry of a state_dict
PLAIN = (bool, int, float, str)  # what an extra-state entry may hold beside None and tensors (weights_only loads it)


def payload(step: int, weights: dict, trainer: dict, locals_by_rank: list[dict], metrics: dict | None = None) -> dict:
    """Build the dict that :func:`write` saves; ``metrics`` go in its marker."""
    return {
        "marker": marker_payload(step, "legacy", len(locals_by_rank), metrics),
        "weights": weights,
        "trainer": _packed(trainer),
        "local": [_packed(local) for local in locals_by_rank],
    }


def write(path: pathlib.Path, content: dict) -> pathlib.Path:
    """Atomically write ``content`` to ``path`` (temp file + ``os.replace``).

    Raises:
        DiskFullError: the disk filled up; the temp file is removed and the previous ``path`` is intact.
    """
    with storage_errors(path.parent, lambda: tensor_bytes(content), path.name,
                        "nothing was published: the previous checkpoint is intact and stays the latest"):
        return W.atomic_write(path, lambda f: torch.save(content, f))


def read_info(path: pathlib.Path) -> CheckpointInfo:
    """Read the marker of a legacy file without reading its tensors.

    Raises:
        CheckpointError: the file does not load with ``weights_only=True`` or
            holds no valid legacy marker.
    """
    content = _load(path, mmap=True, checkpoint=path)
    if not isinstance(content, dict) or "marker" not in content:
        raise CheckpointError(path, path.name, "holds no pimm_fn legacy 'marker' entry: it is not a legacy checkpoint")
    try:
        return info_from_marker(path, content["marker"], "legacy")
    except ValueError as exc:
        raise CheckpointError(path, path.name, f"has an invalid marker ({exc})") from None


def read(path: pathlib.Path, rank: int) -> tuple[dict, dict, dict | None]:
    """Load ``(weights, trainer, local)``; ``local`` is ``None`` past the saved ranks.

    Raises:
        CheckpointError: the file is damaged (naming it and how), or its
            ``weights`` are not a state_dict (:func:`weights_problem`).
    """
    content = _load(path, mmap=False, checkpoint=path)
    read_info(path)
    try:
        locals_by_rank = content["local"]
        local = _unpacked(locals_by_rank[rank]) if rank < len(locals_by_rank) else None
        trainer = _unpacked(content["trainer"])
    except Exception as exc:  # noqa: BLE001 - overwritten bytes fail in JSON, in unicode, in a lookup
        raise CheckpointError(path, path.name, f"holds trainer state that does not unpack ({cause(exc)})") from None
    weights = content.get("weights")
    problem = weights_problem(weights)
    if problem is not None:
        raise CheckpointError(path, path.name, f"has a 'weights' entry that {problem} (written by another program, "
                                               "or altered)")
    return weights, trainer, local


def weights_problem(weights: Any) -> str | None:
    """Why ``weights`` is not a model state_dict as pimm_fn writes one; ``None`` when it is.

    A state_dict maps names (strings) to tensors; a module's extra state
    (a key ending in ``_extra_state``, ``Module.get_extra_state``) may also be
    ``None``, a bool, a number or a string, which ``weights_only`` loads too.

    Example:
        >>> weights_problem({"w": torch.ones(1), "bn._extra_state": 3}) is None
        True
        >>> weights_problem({"w": "x"})
        "maps 'w' to a str where a state_dict holds a tensor"
    """
    if not isinstance(weights, Mapping):
        return f"holds {_a(weights)} where a state_dict (a dict of tensors) is expected"
    for key, value in weights.items():
        if not isinstance(key, str):
            return f"has a key {shown(key, 40)} ({_a(key)}) where a state_dict has names (strings)"
        if isinstance(value, torch.Tensor):
            continue
        if not (key.endswith(EXTRA_STATE) and (value is None or isinstance(value, PLAIN))):
            return f"maps {key!r} to {_a(value)} where a state_dict holds a tensor"
    return None


def checked_weights(weights: Any, checkpoint: pathlib.Path, file: str) -> dict:
    """``weights`` read from ``file`` of ``checkpoint``, once :func:`weights_problem` finds nothing wrong.

    Raises:
        CheckpointError: naming ``file`` and what it holds instead of a state_dict.
    """
    problem = weights_problem(weights)
    if problem is not None:
        raise CheckpointError(checkpoint, file, f"{problem} (written by another program, or altered)")
    return weights


def _a(value: Any) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"



def _load(path: pathlib.Path, *, mmap: bool, checkpoint: pathlib.Path | None = None) -> Any:
    """``torch.load(path, weights_only=True)``; a failure is a ``ValueError`` saying why, without torch's unsafe advice.

    With ``checkpoint`` (the checkpoint ``path`` belongs to) it is a
    :class:`CheckpointError` naming both, also for a missing file.
    """
    if storage.is_store(path):  # read whole from the store: nothing to map
        return _load_stored(path, checkpoint)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        if checkpoint is None:
            raise
        raise CheckpointError(checkpoint, _relative(path, checkpoint), "is missing") from None
    except Exception as exc:  # noqa: BLE001 - torch raises many types for bad files
        if not zipfile.is_zipfile(path):
            problem = "does not load with torch.load(weights_only=True): it is not a torch file (cut short or overwritten)"
        else:
            problem = f"does not load with torch.load(weights_only=True) ({cause(exc)})"
        if checkpoint is None:
            raise ValueError(f"{path} {problem}") from None
        raise CheckpointError(checkpoint, _relative(path, checkpoint), problem) from None


def _load_stored(path, checkpoint) -> Any:
    """:func:`_load` of an object on an fsspec store: its bytes, then ``torch.load(weights_only=True)``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if checkpoint is None:
            raise
        raise CheckpointError(checkpoint, _relative(path, checkpoint), "is missing") from None
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for bad files
        problem = f"does not load with torch.load(weights_only=True) ({cause(exc)})"
        if checkpoint is None:
            raise ValueError(f"{path} {problem}") from None
        raise CheckpointError(checkpoint, _relative(path, checkpoint), problem) from None


def _relative(path: pathlib.Path, checkpoint: pathlib.Path) -> str:
    return path.name if path == checkpoint else path.relative_to(checkpoint).as_posix()


def _packed(obj: Any) -> dict:
    skeleton, tensors = pack(obj)
    return {"skeleton": skeleton, "tensors": tensors}


def _unpacked(entry: dict) -> Any:
    return unpack(entry["skeleton"], entry["tensors"])
