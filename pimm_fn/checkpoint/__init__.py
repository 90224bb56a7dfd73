"""Checkpoint files: formats, atomic publish, discovery, retention, loading.

This is an impure edge of pimm_fn: it touches files and, when a process
group is initialized, ``torch.distributed``. Loading never unpickles code:
weights go through ``torch.load(weights_only=True)`` and trainer state
through ``torch.distributed.checkpoint`` as tensors plus a JSON skeleton.
What a trainer checkpoint holds is one value, ``TrainerContents``
(:mod:`.contents`), turned into the ``trainer`` and ``local`` parts by
``to_parts`` and read back by ``from_parts``. Tools (the command line,
compat) list, describe and read back checkpoints through :mod:`.inspection`;
background saves are a run's :class:`BackgroundSaver` (:mod:`.background`);
process groups are :mod:`pimm_fn.dist`'s. A ``model_dir`` may be an fsspec
URL (``s3://``, ``gs://``, ``memory://``): :mod:`.storage` tells it from a
local path, and there a checkpoint is committed by its marker, not a rename.

Example:
    >>> import tempfile, torch
    >>> model_dir = tempfile.mkdtemp()
    >>> _ = save_checkpoint(model_dir, step=1, weights={"w": torch.zeros(1)},
    ...                     trainer={}, local={})
    >>> latest_checkpoint(model_dir).step
    1
"""

from pimm_fn.checkpoint.background import AsyncSave, BackgroundSaver, prewarm_async_save, save_checkpoint_async
from pimm_fn.checkpoint.contents import (
    PerRank,
    Replicated,
    SavedState,
    TrainerContents,
    from_parts,
    saved_state,
    to_parts,
)
from pimm_fn.checkpoint.discovery import find_checkpoint, latest_checkpoint, rolling_checkpoint
from pimm_fn.checkpoint.errors import CheckpointError, CheckpointStorageError, DiskFullError, SetAsideWarning
from pimm_fn.checkpoint.files import CheckpointInfo
from pimm_fn.checkpoint.formats.one_file import best_record, record_problem, write_best
from pimm_fn.checkpoint.saving import LoadedCheckpoint, load_checkpoint, save_checkpoint
from pimm_fn.checkpoint.validation import validate
from pimm_fn.checkpoint.warm_start import KeyRule, WeightsReport, load_weights_file, remap_state_dict

__all__ = [
    "AsyncSave",
    "BackgroundSaver",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStorageError",
    "DiskFullError",
    "KeyRule",
    "LoadedCheckpoint",
    "PerRank",
    "Replicated",
    "SavedState",
    "SetAsideWarning",
    "TrainerContents",
    "WeightsReport",
    "best_record",
    "find_checkpoint",
    "from_parts",
    "latest_checkpoint",
    "load_checkpoint",
    "load_weights_file",
    "prewarm_async_save",
    "record_problem",
    "remap_state_dict",
    "rolling_checkpoint",
    "save_checkpoint",
    "save_checkpoint_async",
    "saved_state",
    "to_parts",
    "validate",
    "write_best",
]
