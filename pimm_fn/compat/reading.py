"""Reading pimm's checkpoint files safely, and finding them as pimm does.

pimm writes (``PIMM.md`` 3.2-3.4), under ``save_path/model/``: the split
layout ``last/`` (``weights.pth`` holding ``{"state_dict": ...}``,
``trainer.dcp/`` a ``torch.distributed.checkpoint`` directory of the
trainer payload without the model, ``.complete`` markers), and the one-file
``model_last.pth`` (pimm's whole payload, or an older Pointcept-style
``{"epoch", "iter", "state_dict", ...}``).

Everything is read with ``torch.load(weights_only=True)`` (numpy arrays
admitted, as pimm's RNG state holds one) and DCP directories through
``pimm_fn.checkpoint.formats.dcp_reading`` (their plain values the same way, their
metadata by an unpickler that admits DCP's own types only): nothing runs code (pimm loads
with ``weights_only=False``, ``PIMM.md`` 6.1). pimm's data-loader cursor is
itself a pickle inside the payload: it is read as bytes, never unpickled.
``pimm_fn.compat.checkpoints`` translates what is read for a resume.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from pimm_fn import checkpoint
from pimm_fn.checkpoint import inspection
from pimm_fn.checkpoint.errors import shown
from pimm_fn.checkpoint.formats import dcp_reading

__all__ = [
    "PimmCheckpointError",
    "PimmCheckpoint",
    "read_pimm_checkpoint",
    "latest_pimm_checkpoint",
    "pimm_source",
    "safe_load",
    "unwrapped",
    "state_dict_of",
    "is_pimm_fn",
    "holds_pimm_fn",
]

MARKER = ".complete"  # pimm's success marker (path.py::checkpoint_success_file)
WEIGHTS = "weights.pth"
TRAINER = "trainer.dcp"
LEGACY = "model_last.pth"


class PimmCheckpointError(ValueError):
    """A pimm checkpoint that cannot be read or translated; the message says why and what to do."""


def safe_load(source):
    """``torch.load(source, weights_only=True)`` on CPU, numpy arrays and scalars admitted (pimm's RNG states).

    Raises:
        PimmCheckpointError: the file holds anything else (classes, functions).
    """
    try:
        with torch.serialization.safe_globals(dcp_reading.plain_globals()):
            return torch.load(source, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch raises many types for unsafe or bad files
        where = source if isinstance(source, (str, os.PathLike)) else "a DCP entry"
        raise PimmCheckpointError(
            f"{where} does not load with torch.load(weights_only=True) ({type(exc).__name__}: {str(exc)[:160]}); "
            f"pimm_fn never unpickles code: re-save its state_dict with plain tensors"
        ) from None


# -- reading ----------------------------------------------------------------------------------------------------
def _lists(tree):
    """Dicts whose keys are exactly ``0..n-1`` (DCP's paths into lists) back as lists."""
    if not isinstance(tree, dict):
        return tree
    tree = {k: _lists(v) for k, v in tree.items()}
    if tree and all(isinstance(k, int) for k in tree) and sorted(tree) == list(range(len(tree))):
        return [tree[i] for i in range(len(tree))]
    return tree


def _read_dcp(directory: pathlib.Path) -> dict:
    """The nested payload pimm's ``dcp.save(payload)`` wrote: tensors and plain values, read without pickle.

    Raises:
        PimmCheckpointError: no ``.complete`` marker, or the metadata places
            its entries where no nested payload can hold them.
        CheckpointError: the DCP directory is damaged (``safe_reading``).
    """
    if not (directory / MARKER).is_file():
        raise PimmCheckpointError(f"Incomplete DCP checkpoint: {directory} (no {MARKER} marker)")
    meta = dcp_reading.metadata(directory, within="")
    paths = _paths(directory, meta)
    template = {
        key: dcp_reading.empty(md, directory, key, within="") if isinstance(md, TensorStorageMetadata) else None
        for key, md in meta.state_dict_metadata.items()
    }
    dcp_reading.load(template, directory, within="", meta=meta, plain_values=True)  # plain values: weights_only
    nested: dict = {}
    for key, value in template.items():
        path = paths[key]
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})  # a dict: no path is another's prefix (_paths)
        node[path[-1]] = value
    return _lists(nested)


def _paths(directory: pathlib.Path, meta) -> dict[str, tuple]:
    """Where each entry goes in the nested payload: DCP's ``planner_data`` (``{key: (name or index, ...)}``), else
    its key; each path a non-empty tuple of strings and ints, none equal to or a prefix of another."""
    planned = meta.planner_data or {}  # a dict or None: safe_reading's metadata checks
    paths: dict[str, tuple] = {}
    for key in meta.state_dict_metadata:
        path = planned.get(key, (key,))
        if (
            not isinstance(path, (tuple, list))
            or not path
            or not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in path)
        ):
            raise PimmCheckpointError(
                f"{directory / '.metadata'} places {key!r} at {shown(path)}, where DCP writes a non-empty tuple of "
                f"names and indices: the checkpoint was not written by pimm's dcp.save, or was altered"
            )
        paths[key] = tuple(path)
    owner = {path: key for key, path in paths.items()}
    for key, path in paths.items():
        clash = next((owner[path[:n]] for n in range(1, len(path) + 1) if owner.get(path[:n], key) != key), None)
        if clash is not None:
            raise PimmCheckpointError(
                f"{directory / '.metadata'} places {key!r} at {shown(path)} and {clash!r} at "
                f"{shown(paths[clash])}: one would overwrite the other; the checkpoint was not written by pimm's "
                f"dcp.save, or was altered"
            )
    return paths


def unwrapped(weights: Mapping) -> dict:
    """``weights`` without DDP's ``module.`` prefix, when every key has it (pimm_fn keeps bare keys)."""
    keys = list(weights)
    if keys and all(k.startswith("module.") for k in keys):
        return {k[len("module.") :]: v for k, v in weights.items()}
    return dict(weights)


def state_dict_of(content, where) -> dict:
    """pimm's ``checkpoint_model_state_dict``: ``["model"]["state_dict"]``, else ``["state_dict"]``, else itself."""
    if isinstance(content, Mapping):
        model = content.get("model")
        if isinstance(model, Mapping) and isinstance(model.get("state_dict"), Mapping):
            return dict(model["state_dict"])
        if isinstance(content.get("state_dict"), Mapping):
            return dict(content["state_dict"])
        if isinstance(content.get("marker"), Mapping) and isinstance(content.get("weights"), Mapping):
            return dict(content["weights"])  # a pimm_fn legacy file
        if content and all(isinstance(v, torch.Tensor) for v in content.values()):
            return dict(content)
    raise PimmCheckpointError(f"{where} holds no model state_dict (got {type(content).__name__})")


def _is_split(path: pathlib.Path) -> bool:
    return (path / MARKER).is_file() and (path / WEIGHTS).is_file() and (path / TRAINER / MARKER).is_file()


def _is_complete(path: pathlib.Path) -> bool:
    return path.is_dir() and (path / MARKER).is_file()


class PimmCheckpoint:
    """A pimm checkpoint read into memory: ``weights`` (bare keys) and ``payload`` (the trainer part, or ``{}``)."""

    def __init__(self, path: pathlib.Path, weights: dict, payload: dict):
        self.path, self.weights, self.payload = path, weights, payload

    def __repr__(self):
        return f"PimmCheckpoint({str(self.path)!r}, {len(self.weights)} weights, payload {sorted(self.payload)[:6]})"


def read_pimm_checkpoint(path: str | os.PathLike) -> PimmCheckpoint:
    """Read a pimm checkpoint: a complete split ``last/``, a complete DCP directory, or a one-file payload.

    Raises:
        FileNotFoundError: nothing at ``path``.
        PimmCheckpointError: an incomplete directory, a file that does not load safely, or DCP
            metadata placing its entries where no nested payload can hold them.
        CheckpointError: a damaged or crafted DCP directory (``pimm_fn.checkpoint.formats.dcp_reading``).
    """
    path = pathlib.Path(path)
    if path.is_dir():
        if _is_split(path):
            weights = state_dict_of(safe_load(path / WEIGHTS), path / WEIGHTS)
            return PimmCheckpoint(path, unwrapped(weights), _read_dcp(path / TRAINER))
        if _is_complete(path):
            payload = _read_dcp(path)
            return PimmCheckpoint(path, unwrapped(state_dict_of(payload, path)), payload)
        raise PimmCheckpointError(
            f"Incomplete checkpoint directory: {path} (no {MARKER} marker, or a split "
            f"checkpoint without {WEIGHTS} or a complete {TRAINER}/)"
        )
    if not path.exists():
        raise FileNotFoundError(f"No weight found at: {path}")
    content = safe_load(path)
    payload = (
        {k: v for k, v in content.items() if k not in ("model", "state_dict")} if isinstance(content, Mapping) else {}
    )
    return PimmCheckpoint(path, unwrapped(state_dict_of(content, path)), payload)


def latest_pimm_checkpoint(model_dir: str | os.PathLike) -> pathlib.Path | None:
    """pimm's ``latest_complete_checkpoint`` (``PIMM.md`` 3.9): the newest of ``last``, ``last.prev``, ``model_last.pth``.

    A directory counts when it is a complete split or DCP checkpoint, a file
    when it exists; the greatest modification time wins, the earlier
    candidate on a tie. ``last.tmp``, ``*.pth.prev``, ``iter_*`` and
    ``model_best.pth`` are never candidates.
    """
    root = pathlib.Path(model_dir)
    best, when = None, None
    for name in ("last", "last.prev", LEGACY):
        candidate = root / name
        ok = (_is_split(candidate) or _is_complete(candidate)) if candidate.is_dir() else candidate.is_file()
        if ok:
            mtime = candidate.stat().st_mtime
            if when is None or mtime > when:
                best, when = candidate, mtime
    return best


def is_pimm_fn(path: pathlib.Path) -> bool:
    """A directory laid out as a pimm_fn checkpoint, complete or not (``pimm_fn.checkpoint.inspection``)."""
    return inspection.is_checkpoint_dir(path)


def pimm_source(path) -> pathlib.Path | None:
    """The pimm checkpoint ``path`` names, or ``None`` when it names none (pimm_fn's, or nothing known).

    ``path`` may be a pimm checkpoint directory or file, or a ``model_dir`` /
    ``save_path`` holding pimm's layout and no pimm_fn checkpoint.
    """
    p = pathlib.Path(path)
    if p.is_file():
        return None if holds_pimm_fn(p) else p
    if not p.is_dir() or is_pimm_fn(p):
        return None
    if (p / MARKER).is_file() or (p / WEIGHTS).is_file():
        return p
    model_dir = p / "model" if (p / "model").is_dir() else p
    return None if holds_pimm_fn(model_dir) else latest_pimm_checkpoint(model_dir)


def holds_pimm_fn(path: pathlib.Path) -> bool:
    """Whether ``path`` (a file, a checkpoint or a model_dir) is or holds a usable pimm_fn checkpoint (local).

    Told by pimm_fn's own validation: what it refuses is not one of ours.
    """
    try:
        checkpoint.find_checkpoint(path)
    except (FileNotFoundError, ValueError):  # a CheckpointError is a ValueError
        return False
    return True
