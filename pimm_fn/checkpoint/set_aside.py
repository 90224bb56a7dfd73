"""A checkpoint that does not validate, in the way of a save: moved aside and kept, never deleted or overwritten.

A save takes names an earlier checkpoint may hold: ``last`` (or
``last.pth``) and ``iter_<step>`` (a run resumed from an older snapshot
saves the same steps again). One there that validates is replaced as
before; one that does not (a file cut short or changed since the save, a
lost marker) is the library's to leave alone, since it could not read it:
it is renamed ``damaged-<name>`` (``damaged-<name>-2``, ... when that is
taken), with a :class:`SetAsideWarning` saying where and why. Discovery,
retention and clean-up never look at those names; ``python -m pimm_fn ls``
lists them, and removing or repairing one is the user's call.

On an fsspec store, which has no rename, its objects are copied (server
side) under the new name, its marker last, before the original is deleted.

A set-aside the storage refuses (a directory this user may not rename, an
immutable checkpoint) loses nothing either: the damaged checkpoint stays as
it was, the save that needed its name is not published (its caller removes
what it staged), and a :class:`CheckpointStorageError` says both and how to
go on.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import warnings

from . import _layout as L
from . import storage, validation
from ._marker import CheckpointInfo
from .errors import CheckpointError, CheckpointStorageError, cause

__all__ = ["SET_ASIDE", "SetAsideWarning", "readable_or_set_aside", "set_aside"]

SET_ASIDE = "damaged-"


class SetAsideWarning(UserWarning):
    """A save found a checkpoint it could not read where it writes, and kept it under another name."""


def readable_or_set_aside(path: pathlib.Path, *, otherwise: str) -> CheckpointInfo | None:
    """The info of the checkpoint at ``path`` when it validates; else it is set aside (said) and ``None``.

    Args:
        otherwise: what the save that writes ``path`` comes to when the set-aside
            is refused ("the checkpoint of step 8 is not published ..."), for the error.

    Raises:
        CheckpointStorageError: the storage refused the set-aside; the damaged checkpoint is left as it was.
    """
    try:
        return validation.validate(path)
    except CheckpointError as exc:
        damaged = exc
    try:
        kept = set_aside(path)
    except OSError as refused:
        raise CheckpointStorageError(
            f"{damaged.summary()}. A save writes {path.name} now, so that checkpoint was to be kept as "
            f"{_free_name(path).name}, which the storage refused ({cause(refused)}): it is left as it was, and "
            f"{otherwise}. Move {path} out of the way yourself (or make {path.parent} writable), then continue with "
            f"resume='auto', which skips damaged checkpoints"
        ) from refused
    warnings.warn(
        f"{damaged.summary()}: a save writes {path.name} now, so the checkpoint there is kept as {kept.name}, "
        f"never deleted. `python -m pimm_fn verify {kept}` says what is wrong; repair it, or remove it yourself",
        SetAsideWarning,
        stacklevel=2,
    )
    return None


def set_aside(path: pathlib.Path) -> pathlib.Path:
    """Move the checkpoint at ``path`` to the first free ``damaged-<name>[-<n>]`` beside it; returns where.

    Raises:
        OSError: the storage refused; ``path`` is as it was (a store's partial copy, invisible without its marker, removed).
    """
    target = _free_name(path)
    if storage.is_store(path):
        try:
            L.copy_on_store(path, target)
        except BaseException:
            with contextlib.suppress(OSError):  # the refusal that stopped the copy may refuse this too
                L.remove(target)
            raise
        L.remove(path)
    else:
        os.rename(path, target)
    return target


def _free_name(path: pathlib.Path) -> pathlib.Path:
    suffix = path.suffix if path.suffix == ".pth" else ""
    stem = path.name[: len(path.name) - len(suffix)]
    target, n = path.parent / f"{SET_ASIDE}{stem}{suffix}", 2
    while target.exists():
        target, n = path.parent / f"{SET_ASIDE}{stem}-{n}{suffix}", n + 1
    return target
