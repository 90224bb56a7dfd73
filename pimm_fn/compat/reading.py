"""Reading pimm's checkpoint files safely, finding them as pimm does, and pimm's warm start.

pimm writes (``PIMM.md`` 3.2-3.4), under ``save_path/model/``: the split
layout ``last/`` (``weights.pth`` holding ``{"state_dict": ...}``,
``trainer.dcp/`` a ``torch.distributed.checkpoint`` directory of the
trainer payload without the model, ``.complete`` markers), and the one-file
``model_last.pth`` (pimm's whole payload, or an older Pointcept-style
``{"epoch", "iter", "state_dict", ...}``).

Everything is read with ``torch.load(weights_only=True)`` (numpy arrays
admitted, as pimm's RNG state holds one) and DCP directories through
``pimm_fn.checkpoint.safe_reading`` (their plain values the same way, their
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
from pimm_fn.checkpoint import inspection, safe_reading

__all__ = [
    "PimmCheckpointError", "PimmCheckpoint", "read_pimm_checkpoint", "latest_pimm_checkpoint", "pimm_source",
    "load_pimm_weights", "pimm_rules", "remap_pimm_weights", "safe_load",
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
        with torch.serialization.safe_globals(safe_reading.plain_globals()):
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
    """The nested payload pimm's ``dcp.save(payload)`` wrote: tensors and plain values, read without pickle."""
    if not (directory / MARKER).is_file():
        raise PimmCheckpointError(f"Incomplete DCP checkpoint: {directory} (no {MARKER} marker)")
    meta = safe_reading.metadata(directory, within="")
    template = {key: torch.empty(md.size, dtype=md.properties.dtype) if isinstance(md, TensorStorageMetadata) else None
                for key, md in meta.state_dict_metadata.items()}
    safe_reading.load(template, directory, within="", meta=meta, plain_values=True)  # plain values: weights_only
    paths = meta.planner_data if isinstance(meta.planner_data, Mapping) else {}
    nested: dict = {}
    for key, value in template.items():
        path = tuple(paths.get(key, (key,)))
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return _lists(nested)


def _unwrapped(weights: Mapping) -> dict:
    """``weights`` without DDP's ``module.`` prefix, when every key has it (pimm_fn keeps bare keys)."""
    keys = list(weights)
    if keys and all(k.startswith("module.") for k in keys):
        return {k[len("module."):]: v for k, v in weights.items()}
    return dict(weights)


def _state_dict_of(content, where) -> dict:
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


def read_pimm_checkpoint(path) -> PimmCheckpoint:
    """Read a pimm checkpoint: a complete split ``last/``, a complete DCP directory, or a one-file payload.

    Raises:
        FileNotFoundError: nothing at ``path``.
        PimmCheckpointError: an incomplete directory, or a file that does not load safely.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        if _is_split(path):
            weights = _state_dict_of(safe_load(path / WEIGHTS), path / WEIGHTS)
            return PimmCheckpoint(path, _unwrapped(weights), _read_dcp(path / TRAINER))
        if _is_complete(path):
            payload = _read_dcp(path)
            return PimmCheckpoint(path, _unwrapped(_state_dict_of(payload, path)), payload)
        raise PimmCheckpointError(f"Incomplete checkpoint directory: {path} (no {MARKER} marker, or a split "
                                  f"checkpoint without {WEIGHTS} or a complete {TRAINER}/)")
    if not path.exists():
        raise FileNotFoundError(f"No weight found at: {path}")
    content = safe_load(path)
    payload = {k: v for k, v in content.items() if k not in ("model", "state_dict")} if isinstance(content, Mapping) else {}
    return PimmCheckpoint(path, _unwrapped(_state_dict_of(content, path)), payload)


def latest_pimm_checkpoint(model_dir) -> pathlib.Path | None:
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


def _is_pimm_fn(path: pathlib.Path) -> bool:
    """A directory laid out as a pimm_fn checkpoint, complete or not (``pimm_fn.checkpoint.inspection``)."""
    return inspection.is_checkpoint_dir(path)


def pimm_source(path) -> pathlib.Path | None:
    """The pimm checkpoint ``path`` names, or ``None`` when it names none (pimm_fn's, or nothing known).

    ``path`` may be a pimm checkpoint directory or file, or a ``model_dir`` /
    ``save_path`` holding pimm's layout and no pimm_fn checkpoint.
    """
    p = pathlib.Path(path)
    if p.is_file():
        return None if _holds_pimm_fn(p) else p
    if not p.is_dir() or _is_pimm_fn(p):
        return None
    if (p / MARKER).is_file() or (p / WEIGHTS).is_file():
        return p
    model_dir = p / "model" if (p / "model").is_dir() else p
    return None if _holds_pimm_fn(model_dir) else latest_pimm_checkpoint(model_dir)


def _holds_pimm_fn(path: pathlib.Path) -> bool:
    """Whether ``path`` (a file, a checkpoint or a model_dir) is or holds a usable pimm_fn checkpoint (local).

    Told by pimm_fn's own validation: what it refuses is not one of ours.
    """
    try:
        checkpoint.find_checkpoint(path)
    except (FileNotFoundError, ValueError):  # a CheckpointError is a ValueError
        return False
    return True


# -- warm start ---------------------------------------------------------------------------------------------------
def load_pimm_weights(path) -> dict:
    """The model weights at ``path`` as pimm's ``CheckpointLoader`` finds them (``PIMM.md`` 3.6, warm start).

    A directory: ``model.safetensors``/``model.bin`` (an export), a pimm_fn
    checkpoint, or the first of ``weights.pth``, ``last/weights.pth``,
    ``model/last/weights.pth``; a file: its ``["model"]["state_dict"]``,
    ``["state_dict"]`` or itself. Keys come without ``module.``.

    Raises:
        FileNotFoundError: nothing there (pimm's messages).
        PimmCheckpointError: ``hf://`` (download first), or an unsafe file.
    """
    text = os.fspath(path)
    if text.startswith("hf://"):
        raise PimmCheckpointError(
            f"{text}: download Hub weights first (huggingface_hub.hf_hub_download) and pass the local file"
        )
    p = pathlib.Path(text)
    if p.is_dir():
        if (p / "model.safetensors").is_file():
            from safetensors.torch import load_file  # an optional extra, for exported models only

            return _unwrapped(load_file(str(p / "model.safetensors")))
        if (p / "model.bin").is_file():
            return _unwrapped(_state_dict_of(safe_load(p / "model.bin"), p / "model.bin"))
        if _is_pimm_fn(p) or _holds_pimm_fn(p / "model"):
            return _unwrapped(checkpoint.load_weights_file(p))
        for candidate in (p / WEIGHTS, p / "last" / WEIGHTS, p / "model" / "last" / WEIGHTS):
            if candidate.is_file():
                return _unwrapped(_state_dict_of(safe_load(candidate), candidate))
        if _holds_pimm_fn(p):
            return _unwrapped(checkpoint.load_weights_file(p))
        raise FileNotFoundError(
            f"Weight directory must contain weights.pth, last/weights.pth, or model/last/weights.pth: {p}"
        )
    if not p.is_file():
        raise FileNotFoundError(f"No weight found at: {p}")
    return _unwrapped(_state_dict_of(safe_load(p), p))


def _strip(name: str) -> str:
    return name[len("module."):] if name.startswith("module.") else name


def pimm_rules(rules) -> list:
    """pimm's ``(keyword, replacement)`` pairs as rules of pimm_fn's one key-rewrite engine (``remap_state_dict``).

    Each keyword matches whole dotted components and may match nothing; of
    two rules for one keyword the one pimm tries first wins (the longer as
    written, then the earlier); a keyword that is empty once ``module.`` and
    a trailing dot are dropped matches nothing, as in pimm.

    >>> pimm_rules([("", ""), ("backbone", "encoder"), ("module.backbone.", "trunk.")])
    [KeyRule(old='module.backbone.', new='trunk.', whole=True, required=False)]
    """
    ordered = sorted(rules or (), key=lambda rule: len(_strip(rule[0])), reverse=True)  # stable: pimm's order
    chosen: dict = {}
    for keyword, replacement in ordered:
        bare = _strip(keyword).rstrip(".")
        if bare and bare not in chosen:
            chosen[bare] = checkpoint.KeyRule(keyword, replacement, whole=True, required=False)
    return list(chosen.values())


def remap_pimm_weights(weights: Mapping, rules, model_state: Mapping, *, strict: bool = False):
    """pimm's key rewrite (``PIMM.md`` 3.7), on whole dotted components, and its shape and zero-match checks.

    The rewrite is ``pimm_fn.checkpoint.remap_state_dict`` fed ``pimm_rules(rules)``.
    Returns ``(remapped, skipped)``: the dict to load and the keys left at
    their initial values for another shape (non-strict only).

    Raises:
        RuntimeError: no key of the model would load (pimm's message).
        ValueError: two keys of the file map to one name (pimm would load one of them silently).

    >>> import torch
    >>> model = {"encoder.w": torch.zeros(2), "encoder2.w": torch.zeros(2), "head.b": torch.zeros(1)}
    >>> out, skipped = remap_pimm_weights({"module.backbone.w": torch.ones(2), "head.b": torch.ones(3)},
    ...                                   [("backbone", "encoder")], model)
    >>> sorted(out), skipped
    (['encoder.w'], ('head.b',))
    """
    out, _ = checkpoint.remap_state_dict(weights, pimm_rules(rules), model_state)
    skipped = ()
    if not strict:
        skipped = tuple(k for k, v in out.items() if k in model_state and hasattr(v, "shape")
                        and tuple(v.shape) != tuple(model_state[k].shape))
        out = {k: v for k, v in out.items() if k not in skipped}
    loaded = sum(1 for k in model_state if k in out)
    if model_state and loaded == 0 and not strict:
        raise RuntimeError(
            f"Checkpoint load matched 0 of {len(model_state)} model parameters (rules={list(rules or [])!r}). The "
            f"model would train from random init. Fix the keyword/replacement rules, or set strict=True to find the "
            f"mismatch."
        )
    return out, skipped
