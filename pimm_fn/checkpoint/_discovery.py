"""Finding the newest complete checkpoint, and resolving user-given paths.

Discovery looks at ``last/``, ``iter_<step>/``, leftover ``.retired-*/``
directories and the legacy ``last.pth`` / ``iter_<step>.pth`` files. It
accepts a directory only with a valid ``COMPLETE`` marker and a file only if
it loads with ``weights_only=True``; ``.staging-*`` entries are never read.
The highest step wins; on a tie ``last`` beats a snapshot, which beats a
retired copy (they hold the same data when their steps agree).
"""

from __future__ import annotations

import os
import pathlib

from . import _layout as L
from . import _legacy, dist
from ._layout import CheckpointInfo

_MODEL = "model"


def discover(model_dir: str | os.PathLike) -> CheckpointInfo | None:
    """The newest complete checkpoint under ``model_dir`` (local, no collectives)."""
    root = pathlib.Path(model_dir)
    if not root.is_dir():
        return None
    ranked = []
    for entry in root.iterdir():
        rank = _priority(entry)
        if rank is None:
            continue
        try:
            info = L.check_standard_dir(entry) if entry.is_dir() else _legacy.read_info(entry)
        except (OSError, ValueError):
            continue
        ranked.append((info.step, rank, info.format == "standard", entry.name, info))
    return max(ranked, key=lambda item: item[:4])[-1] if ranked else None


def latest_checkpoint(model_dir: str | os.PathLike) -> CheckpointInfo | None:
    """The newest complete checkpoint under ``model_dir``, agreed by all ranks.

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
    """Resolve a user-given path to a complete checkpoint (local, no collectives).

    Args:
        path: a checkpoint directory (``.../last``, ``.../iter_100``), a legacy
            file (``last.pth``), a ``model_dir``, or a ``save_dir`` holding
            ``model/``; the latter two resolve to their newest checkpoint.

    Returns:
        The checkpoint's info.

    Raises:
        FileNotFoundError: ``path`` does not exist, or holds no checkpoint.
        ValueError: ``path`` is a checkpoint that is incomplete or damaged.
    """
    p = pathlib.Path(path)
    expected = "a checkpoint directory with a COMPLETE marker, a legacy .pth file, or a save_dir/model_dir"
    if not p.exists():
        raise FileNotFoundError(f"find_checkpoint: {str(p)!r} does not exist; expected {expected}")
    if p.is_file():
        return _legacy.read_info(p)
    if any((p / name).exists() for name in (L.MARKER, L.TRAINER, L.WEIGHTS)):
        try:
            return L.check_standard_dir(p)
        except ValueError as exc:
            raise ValueError(f"find_checkpoint: {exc}; pick a complete one, e.g. the model_dir {str(p.parent)!r}") from None
    model_dir = p / _MODEL if (p / _MODEL).is_dir() else p
    info = discover(model_dir)
    if info is None:
        raise FileNotFoundError(f"find_checkpoint: no complete checkpoint under {str(model_dir)!r}; expected {expected}")
    return info


def _priority(entry: pathlib.Path) -> int | None:
    name = entry.name
    if name.startswith(L.STAGING):
        return None
    if entry.is_dir():
        if name == L.LAST:
            return 2
        if L.ITER_DIR.match(name):
            return 1
        return 0 if name.startswith(L.RETIRED) else None
    if name == L.LEGACY_LAST:
        return 2
    return 1 if L.ITER_FILE.match(name) else None
