"""Checkpoint files: formats, atomic publish, discovery, retention, loading.

This is an impure edge of pimm_fn: it touches files and, when a process
group is initialized, ``torch.distributed``. Loading never unpickles code:
weights go through ``torch.load(weights_only=True)`` and trainer state
through ``torch.distributed.checkpoint`` as tensors plus a JSON skeleton.

Example:
    >>> import tempfile, torch
    >>> model_dir = tempfile.mkdtemp()
    >>> _ = save_checkpoint(model_dir, step=1, weights={"w": torch.zeros(1)},
    ...                     trainer={}, local={})
    >>> latest_checkpoint(model_dir).step
    1
"""

from ._api import LoadedCheckpoint, load_checkpoint, save_checkpoint
from ._async import AsyncSave, prewarm_async_save, save_checkpoint_async
from ._discovery import find_checkpoint, latest_checkpoint
from ._layout import CheckpointInfo
from ._weights import WeightsReport, load_weights_file, remap_state_dict, write_best

__all__ = [
    "AsyncSave",
    "CheckpointInfo",
    "LoadedCheckpoint",
    "WeightsReport",
    "find_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "load_weights_file",
    "prewarm_async_save",
    "remap_state_dict",
    "save_checkpoint",
    "save_checkpoint_async",
    "write_best",
]
