"""The entries of a ``model_dir`` that could be resumed from, each examined and ranked: what discovery walks.

``candidates`` lists every checkpoint under a ``model_dir``, usable or
not, newest first; each is checked by :mod:`.validation` (its marker and
file sizes, no digests) and its error kept, so a caller can say why a
newer one was passed over. Local, no collectives: :mod:`.choice` agrees
across ranks on which one to use.
"""

from __future__ import annotations

import os
import pathlib

import attrs

from . import _layout as L
from . import _legacy, storage
from ._marker import CheckpointInfo
from .errors import CheckpointError
from .validation import check_files, read_marker

__all__ = ["Candidate", "candidates"]


@attrs.frozen
class Candidate:
    """One entry of a model_dir that could be resumed from: usable (``info``) or not (``error``).

    Attributes:
        path: the checkpoint directory or legacy file.
        step: its step: from the marker, else from the name (``iter_<step>``); ``None`` when unknown.
        info: the checkpoint, when it validates.
        error: why it does not, otherwise.
        priority: how it ranks among entries of one step: 2 ``last``, 1 a snapshot, 0 a retired copy.
    """

    path: pathlib.Path
    step: int | None
    info: CheckpointInfo | None = None
    error: CheckpointError | None = None
    priority: int = 0


def candidates(model_dir: str | os.PathLike) -> list[Candidate]:
    """Every checkpoint under ``model_dir``, usable or not, newest first (local, no collectives).

    Newest means the highest step; a damaged ``last`` whose step is unknown
    counts as the newest. On a tie ``last`` beats a snapshot, which beats a
    retired copy, and the standard format beats the legacy one.
    ``.staging-*`` entries are never looked at, nor retired copies whose
    marker is gone (a deletion under way), nor, on an fsspec store, any
    directory without a marker (being written or deleted: the marker commits).
    """
    root = storage.location(model_dir)
    if not root.is_dir():
        return []
    found = [c for c in map(_examine, root.iterdir()) if c is not None]
    key = lambda c: (float("inf") if c.step is None else c.step, c.priority, c.path.is_dir(), c.path.name)
    return sorted(found, key=key, reverse=True)


def _examine(entry: pathlib.Path) -> Candidate | None:
    priority = _priority(entry)
    if priority is None:
        return None
    if not entry.is_dir():
        try:
            info = _legacy.read_info(entry)
        except CheckpointError as exc:
            return Candidate(entry, _named_step(entry), error=exc, priority=priority)
        return Candidate(entry, info.step, info, priority=priority)
    try:
        info, payload = read_marker(entry)
    except CheckpointError as exc:
        if storage.is_store(entry) and not (entry / L.MARKER).exists():
            return None  # on a store the marker commits: without it, being written or deleted
        return None if priority == 0 else Candidate(entry, _named_step(entry), error=exc, priority=priority)
    try:
        check_files(entry, payload, False)
    except CheckpointError as exc:
        return Candidate(entry, info.step, error=exc, priority=priority)
    return Candidate(entry, info.step, info, priority=priority)


def _priority(entry: pathlib.Path) -> int | None:
    name = entry.name
    if name.startswith(L.STAGING):
        return None
    if entry.is_dir():
        if name == L.LAST or (storage.is_store(entry) and L.STORE_LAST.match(name)):
            return 2
        if L.ITER_DIR.match(name):
            return 1
        return 0 if name.startswith(L.RETIRED) else None
    if name == L.LEGACY_LAST:
        return 2
    return 1 if L.ITER_FILE.match(name) else None


def _named_step(entry: pathlib.Path) -> int | None:
    match = (L.ITER_DIR if entry.is_dir() else L.ITER_FILE).match(entry.name)
    return int(match.group(1)) if match else None
