"""Atomic publishing of a finished checkpoint, snapshots and retention.

All functions here run on the main rank only, on a ``model_dir`` that no
other process writes to at the same time.

Publishing a standard checkpoint is two renames::

    last/           -> .retired-last-<old step>/
    .staging-last-<step>/ -> last/

then the retired directory is deleted. Between the renames there is no
``last/`` but the retired one is complete and discovery reads it, so at
every instant some complete checkpoint at least as new as the previous one
is discoverable. Legacy files need a single ``os.replace``.
"""

from __future__ import annotations

import os
import pathlib
import shutil

from . import _layout as L


def fresh_staging(model_dir: pathlib.Path, step: int) -> pathlib.Path:
    """Remove every stale ``.staging-*`` entry, then create an empty staging dir.

    Stale entries are what an earlier save left when it crashed; they are
    never discovered, so deleting them loses nothing.
    """
    model_dir.mkdir(parents=True, exist_ok=True)
    clean_staging(model_dir)
    staging = model_dir / f"{L.STAGING}{L.LAST}-{step}"
    staging.mkdir()
    return staging


def clean_staging(model_dir: pathlib.Path) -> None:
    """Delete every ``.staging-*`` file or directory under ``model_dir``."""
    for entry in model_dir.glob(f"{L.STAGING}*"):
        L.remove(entry)


def publish_dir(model_dir: pathlib.Path, staging: pathlib.Path) -> pathlib.Path:
    """Make a complete staging directory the new ``last/``.

    Args:
        model_dir: the checkpoint root.
        staging: a directory holding a valid ``COMPLETE`` marker.

    Returns:
        The path of the published ``last/``.
    """
    last = model_dir / L.LAST
    if last.exists():
        try:
            old = str(L.check_standard_dir(last).step)
        except ValueError:
            old = "incomplete"
        retired = model_dir / f"{L.RETIRED}{L.LAST}-{old}"
        L.remove(retired)
        os.rename(last, retired)
    os.rename(staging, last)
    L.fsync_dir(model_dir)
    for retired in model_dir.glob(f"{L.RETIRED}*"):
        L.remove(retired)
    return last


def publish_staged(model_dir: pathlib.Path, staging: pathlib.Path, step: int, world_size: int) -> pathlib.Path:
    """Mark a staging directory whose files are all durable complete, and publish it.

    The trainer directory's entries are made durable first (DCP fsyncs its
    files but not their directory), then ``COMPLETE`` is written and
    fsynced with the staging directory, then :func:`publish_dir` renames.
    """
    L.fsync_dir(staging / L.TRAINER)
    L.write_marker(staging, step, world_size, staged=True)
    return publish_dir(model_dir, staging)


def publish_file(model_dir: pathlib.Path, staged: pathlib.Path) -> pathlib.Path:
    """Make a complete staged legacy file the new ``last.pth``."""
    last = model_dir / L.LEGACY_LAST
    os.replace(staged, last)
    L.fsync_dir(model_dir)
    return last


def snapshot(model_dir: pathlib.Path, published: pathlib.Path, step: int) -> pathlib.Path:
    """Copy a published checkpoint to ``iter_<step>`` (hard links when possible).

    The copy is built under a staging name and renamed, so a crash never
    leaves a half-copied snapshot under a discoverable name. An existing
    snapshot of the same step (a re-save after resuming) is replaced.
    """
    if published.is_dir():
        staging = model_dir / f"{L.STAGING}iter_{step}"
        L.remove(staging)
        shutil.copytree(published, staging, copy_function=L.link_or_copy)
        target = model_dir / f"iter_{step}"
        L.remove(target)
        os.rename(staging, target)
    else:
        staging = model_dir / f"{L.STAGING}iter_{step}.pth"
        L.remove(staging)
        L.link_or_copy(str(published), str(staging))
        target = model_dir / f"iter_{step}.pth"
        os.replace(staging, target)
    L.fsync_dir(model_dir)
    return target


def snapshots(model_dir: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    """All ``iter_<step>`` snapshots (either format), oldest first."""
    found = []
    for entry in model_dir.glob("iter_*"):
        match = (L.ITER_DIR if entry.is_dir() else L.ITER_FILE).match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found, key=lambda item: (item[0], item[1].name))


def prune_snapshots(model_dir: pathlib.Path, keep: int) -> list[pathlib.Path]:
    """Delete the oldest snapshots so that at most ``keep`` remain.

    Returns:
        The deleted paths, oldest first.
    """
    snaps = snapshots(model_dir)
    doomed = [path for _, path in snaps[: max(len(snaps) - keep, 0)]]
    for path in doomed:
        L.remove(path)
    return doomed
