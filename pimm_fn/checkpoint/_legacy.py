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

import pathlib
from typing import Any

import torch

from . import _layout as L
from ._pack import pack, unpack


def payload(step: int, weights: dict, trainer: dict, locals_by_rank: list[dict]) -> dict:
    """Build the dict that :func:`write` saves."""
    return {
        "marker": L.marker_payload(step, "legacy", len(locals_by_rank)),
        "weights": weights,
        "trainer": _packed(trainer),
        "local": [_packed(local) for local in locals_by_rank],
    }


def write(path: pathlib.Path, content: dict) -> pathlib.Path:
    """Atomically write ``content`` to ``path`` (temp file + ``os.replace``)."""
    return L.atomic_write(path, lambda f: torch.save(content, f))


def read_info(path: pathlib.Path) -> L.CheckpointInfo:
    """Read the marker of a legacy file without reading its tensors.

    Raises:
        ValueError: the file does not load with ``weights_only=True`` or
            holds no valid legacy marker.
    """
    content = _load(path, mmap=True)
    if not isinstance(content, dict) or "marker" not in content:
        raise ValueError(f"{path} is a torch file without a pimm_fn legacy 'marker' entry; not a legacy checkpoint")
    try:
        return L.info_from_marker(path, content["marker"], "legacy")
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def read(path: pathlib.Path, rank: int) -> tuple[dict, dict, dict | None]:
    """Load ``(weights, trainer, local)``; ``local`` is ``None`` past the saved ranks."""
    content = _load(path, mmap=False)
    read_info(path)
    locals_by_rank = content["local"]
    local = _unpacked(locals_by_rank[rank]) if rank < len(locals_by_rank) else None
    return content["weights"], _unpacked(content["trainer"]), local


def _load(path: pathlib.Path, *, mmap: bool) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch raises many types for bad files
        raise ValueError(
            f"{path} does not load with torch.load(weights_only=True) ({type(exc).__name__}: {str(exc)[:200]}); "
            "it is truncated, not a torch file, or holds arbitrary objects"
        ) from None


def _packed(obj: Any) -> dict:
    skeleton, tensors = pack(obj)
    return {"skeleton": skeleton, "tensors": tensors}


def _unpacked(entry: dict) -> Any:
    return unpack(entry["skeleton"], entry["tensors"])
