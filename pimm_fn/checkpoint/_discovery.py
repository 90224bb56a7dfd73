"""Finding the newest usable checkpoint, and resolving user-given paths.

Which entries of a model_dir count, and in which order, is
:func:`.candidates.candidates`: ``last/``, ``iter_<step>/``, leftover
``.retired-*/`` directories and the legacy ``last.pth`` / ``iter_<step>.pth``
files, highest step first (on a tie ``last`` beats a snapshot, which beats a
retired copy: they hold the same data when their steps agree), each valid
only when :func:`.validation.validate` says so; ``.staging-*`` entries are
never read.
"""

from __future__ import annotations

import os

from pimm_fn import dist

from . import _layout as L
from . import candidates, storage, validation
from ._marker import CheckpointInfo

_MODEL = "model"


def discover(model_dir: str | os.PathLike) -> CheckpointInfo | None:
    """The newest usable checkpoint under ``model_dir`` (local, no collectives)."""
    return next((c.info for c in candidates.candidates(model_dir) if c.info is not None), None)


def latest_checkpoint(model_dir: str | os.PathLike) -> CheckpointInfo | None:
    """The newest usable checkpoint under ``model_dir``, agreed by all ranks.

    In a process group rank 0 looks and broadcasts its answer, so every rank
    resumes from the same checkpoint even if file listings lag on some.

    Args:
        model_dir: the checkpoint root (``save_dir/"model"``).

    Returns:
        The checkpoint's info, or ``None`` when there is none.

    Example:
        >>> latest_checkpoint("/nonexistent/model") is None
        True
    """
    return dist.run_on_main(lambda: discover(model_dir))


def find_checkpoint(path: str | os.PathLike) -> CheckpointInfo:
    """Resolve a user-given path to a usable checkpoint (local, no collectives).

    Args:
        path: a checkpoint directory (``.../last``, ``.../iter_100``), a legacy
            file (``last.pth``), a ``model_dir``, or a ``save_dir`` holding
            ``model/``; the latter two resolve to their newest usable checkpoint.

    Returns:
        The checkpoint's info.

    Raises:
        FileNotFoundError: ``path`` does not exist, or holds no checkpoint.
        CheckpointError: (a ``ValueError``) ``path`` is a checkpoint that is
            incomplete or damaged, or a model_dir whose checkpoints all are
            (naming the newest, its damaged file, and what to do).
    """
    p = storage.location(path)
    expected = "a checkpoint directory with a COMPLETE marker, a legacy .pth file, or a save_dir/model_dir"
    if not p.exists():
        raise FileNotFoundError(f"find_checkpoint: {str(p)!r} does not exist; expected {expected}")
    named = p.name == L.LAST or L.ITER_DIR.match(p.name) or p.name.startswith(L.RETIRED)
    if p.is_file() or named or any((p / name).exists() for name in (L.MARKER, L.TRAINER, L.WEIGHTS)):
        return validation.validate(p)
    model_dir = p / _MODEL if (p / _MODEL).is_dir() else p
    found = candidates.candidates(model_dir)
    usable = next((c.info for c in found if c.info is not None), None)
    if usable is not None:
        return usable
    if found:
        raise found[0].error
    raise FileNotFoundError(f"find_checkpoint: no complete checkpoint under {str(model_dir)!r}; expected {expected}")


def rolling_checkpoint(model_dir: str | os.PathLike, step: int, format: str = "standard"):
    """Where the rolling checkpoint of ``step`` lives under ``model_dir``: the name a line should show.

    ``last/`` (``last.pth`` in the legacy format) on a file system; on an
    fsspec store, where a checkpoint is written under its final name, the
    committed ``last-<step>-<token>/`` (``model_dir/last`` only if none is
    listed, as a hint of where to look). Local: no collectives.
    """
    model_dir = storage.location(model_dir)
    if storage.is_store(model_dir):
        for entry in model_dir.iterdir():  # [] where the store has no such directory
            named = L.STORE_LAST.match(entry.name)
            if named and int(named.group(1)) == step and (entry / L.MARKER).exists():
                return entry
    return model_dir / (L.LAST if format == "standard" else L.LEGACY_LAST)
