"""Warm-start weights read from any file or checkpoint pimm_fn understands (key remapping: ``.remap``).

From a checkpoint directory the files read are checked against the SHA-256
digests its marker records, as a resume checks them, and a best-model file
against the digest its ``.json`` records, and a safetensors file pimm_fn
exported against the digest its header records: a warm start never trains
on bytes changed since the save.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from . import _layout as L
from . import _legacy, safetensors_files, sharded, storage, validation
from ._best_model import check_best
from ._discovery import find_checkpoint


def load_weights_file(path: str | os.PathLike) -> dict:
    """Load model weights from any file or checkpoint pimm_fn understands.

    Args:
        path: a state_dict file; a file holding ``{"state_dict": ...}`` or
            ``{"model": ...}`` (pimm, other trainers); a legacy checkpoint; a
            standard checkpoint directory; a model_dir / save_dir (newest); a
            ``.safetensors`` file (one ``python -m pimm_fn export`` wrote, or a
            Hub model's), a sharded Hub model's ``model.safetensors.index.json``,
            or a downloaded Hub model's directory holding either (and no checkpoint).

    Returns:
        The state_dict, on CPU.

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: (a ``ValueError``) a checkpoint directory that is
            damaged, or whose files read differ from the SHA-256 its marker records;
            a best-model file whose bytes differ from the SHA-256 its ``.json`` records;
            a safetensors file that is damaged or crafted, holds a dtype torch lacks,
            or differs from the SHA-256 its header records (``safetensors_files``).
        ValueError: the file is not loadable with ``weights_only=True`` or
            holds no recognizable state_dict.
    """
    p, owner = storage.location(path), None
    if p.is_dir():
        try:
            info = find_checkpoint(p)
        except FileNotFoundError:
            found = safetensors_files.in_directory(p)  # no checkpoint: a downloaded Hub model's weights?
            if found is None:
                raise
            return safetensors_files.read_safetensors(found)
        skipped = info.format == "standard" and (info.path / L.WEIGHTS_SKIPPED).is_file()
        if info.format == "standard":  # a sharded model saved without a weights file is read from its shards
            validation.check_digests(info.path, L.TRAINER if skipped else L.WEIGHTS)
        if skipped:
            return sharded.read_full_weights(info.path)
        p, owner = (info.path / L.WEIGHTS if info.format == "standard" else info.path), info.path
    elif not p.exists():
        raise FileNotFoundError(f"load_weights_file: {str(p)!r} does not exist")
    elif safetensors_files.is_safetensors(p):
        return safetensors_files.read_safetensors(p)
    elif L.is_best_name(p):
        check_best(p)
    content = _legacy._load(p, mmap=False, checkpoint=owner)  # a checkpoint's damaged file is a CheckpointError
    if isinstance(content, Mapping) and isinstance(content.get("marker"), Mapping) and "weights" in content:
        return _legacy.checked_weights(content["weights"], p, p.name)  # a legacy checkpoint's: a state_dict, or damaged
    if isinstance(content, Mapping):
        for key in ("state_dict", "model"):
            if isinstance(content.get(key), Mapping):
                return content[key]
        if content and all(isinstance(v, torch.Tensor) for v in content.values()):
            return content
    keys = list(content)[:8] if isinstance(content, Mapping) else type(content).__name__
    raise ValueError(
        f"load_weights_file: {str(p)!r} holds no state_dict (got {keys}); expected a dict of tensors or a dict "
        "with a 'state_dict' or 'model' entry"
    )
