"""Atomic publishing of a finished checkpoint, snapshots and retention.

All functions here run on the main rank only, on a ``model_dir`` that no
other process writes to at the same time (what every rank leaves for rank 0
to check first, its receipt: :mod:`._receipts`).

Publishing a standard checkpoint is two renames::

    last/           -> .retired-last-<old step>/
    .staging-last-<step>/ -> last/

then the retired directory is deleted. Between the renames there is no
``last/`` but the retired one is complete and discovery reads it, so at
every instant some complete checkpoint at least as new as the previous one
is discoverable. A ``last/`` (or snapshot of the same step) that does not
validate is never retired or replaced but set aside (:mod:`.set_aside`). Legacy files need a single ``os.replace``. On an fsspec
store there is no rename: :mod:`._store_publish` writes under the final name
and the marker commits (each function here hands a store over to it).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil

from pimm_fn import dist

from . import _layout as L
from . import _safe_writes as W
from . import _legacy, _store_publish, storage
from .errors import CheckpointStorageError, storage_error, storage_errors, tensor_bytes
from .manifest import manifest
from .set_aside import readable_or_set_aside

__all__ = ["CheckpointStorageError"]  # defined in .errors, kept importable from here

UNPUBLISHED = "nothing was published: the previous checkpoint is intact and stays the latest"


def removed(staging: pathlib.Path) -> str:
    """What a failed save's error says it left: its staging directory removed, the previous checkpoint the latest."""
    return f"its staging directory {staging.name} is removed and {UNPUBLISHED}"


def fresh_staging(model_dir: pathlib.Path, step: int) -> pathlib.Path:
    """Remove every stale ``.staging-*`` entry, then create an empty staging dir.

    Stale entries are what an earlier save left when it crashed; they are
    never discovered, so deleting them loses nothing.

    Raises:
        DiskFullError: not even the directory could be made.
    """
    staging = model_dir / f"{L.STAGING}{L.LAST}-{step}"
    with storage_errors(model_dir, 0, f"the staging directory {staging.name}", UNPUBLISHED):
        if storage.is_store(model_dir):
            return _store_publish.fresh(model_dir, step)
        model_dir.mkdir(parents=True, exist_ok=True)
        clean_staging(model_dir)
        staging.mkdir()
    return staging


def discard(staging: pathlib.Path, weights_file: "W.BackgroundWrite | None" = None) -> None:
    """After a failed save (main rank): wait for the weights write, then delete the staging directory.

    Nothing reads it, and a save that ran out of space must give the space back.
    """
    if weights_file is not None:
        weights_file.join()
    if dist.is_main():
        L.remove(staging)


def clean_staging(model_dir: pathlib.Path) -> None:
    """Delete every ``.staging-*`` file or directory under ``model_dir``."""
    for entry in model_dir.glob(f"{L.STAGING}*"):
        L.remove(entry)


@contextlib.contextmanager
def _removed_on_error(staging: pathlib.Path):
    """Remove ``staging`` when what runs inside fails: an unpublished save leaves nothing behind."""
    try:
        yield
    except BaseException:
        L.remove(staging)
        raise


def publish_dir(model_dir: pathlib.Path, staging: pathlib.Path, step: int) -> pathlib.Path:
    """Make a complete staging directory the new ``last/``.

    Args:
        model_dir: the checkpoint root.
        staging: a directory holding a valid ``COMPLETE`` marker.
        step: its step, for an error.

    Returns:
        The path of the published ``last/``.

    Raises:
        CheckpointStorageError: a rename (or the set-aside of a damaged
            ``last/``) was refused; the staging directory is removed, and
            ``last/`` (or its retired copy, which discovery reads) is as it was.
    """
    if storage.is_store(model_dir):
        return _store_publish.publish(model_dir, staging, step)
    last = model_dir / L.LAST
    what = f"the checkpoint of step {step}"
    with storage_errors(model_dir, 0, what, removed(staging), doing="publishing"), _removed_on_error(staging):
        unpublished = f"{what} is not published (its staging directory {staging.name} is removed)"
        old = readable_or_set_aside(last, otherwise=unpublished) if last.exists() else None
        if old is not None:
            retired = model_dir / f"{L.RETIRED}{L.LAST}-{old.step}"
            L.remove(retired)
            os.rename(last, retired)
        os.rename(staging, last)
    W.fsync_dir(model_dir)
    for retired in model_dir.glob(f"{L.RETIRED}*"):
        L.remove(retired)
    return last


def publish_staged(
    model_dir: pathlib.Path, staging: pathlib.Path, step: int, world_size: int, metrics: dict | None = None, *,
    weights_file: "W.BackgroundWrite | None" = None, digests: bool = False,
) -> pathlib.Path:
    """Mark a staging directory whose files are all durable complete, and publish it (main rank).

    Waits for ``weights_file`` first, then makes the trainer directory's
    entries durable (DCP fsyncs its files but not their directory), writes
    ``COMPLETE`` with every file's size (and SHA-256 with ``digests``: the
    weights file's as ``weights_file`` hashed it while writing, the others'
    by :func:`.manifest.manifest`), fsynced with the staging directory,
    then :func:`publish_dir` renames.

    Raises:
        DiskFullError: the weights file or the marker did not fit; the
            staging directory is removed, the previous checkpoint intact.
    """
    try:
        if weights_file is not None:
            weights_file.result()
        W.fsync_dir(staging / L.TRAINER)
        hashed = weights_file.sha256 if weights_file is not None else None  # while it was written: no second read
        files = manifest(staging, digests=digests, known={weights_file.path.name: hashed} if hashed else None)
        W.write_marker(staging, step, world_size, staged=True, metrics=metrics, files=files)
    except BaseException as exc:
        nbytes = _staged_bytes(staging, weights_file)
        discard(staging)
        converted = storage_error(exc, model_dir, nbytes, f"the checkpoint of step {step}", removed(staging))
        if converted is exc:
            raise
        raise converted from exc
    return publish_dir(model_dir, staging, step)


def _staged_bytes(staging: pathlib.Path, weights_file: "W.BackgroundWrite | None") -> int:
    """The bytes of a checkpoint that did not fit: its files so far, the weights file in full."""
    if storage.is_store(staging):
        return sum(staging.files().values())
    files = [p for p in staging.rglob("*") if p.is_file() and (weights_file is None or p != weights_file.path)]
    return sum(p.stat().st_size for p in files) + (weights_file.nbytes if weights_file is not None else 0)


def publish_file(model_dir: pathlib.Path, content: dict) -> pathlib.Path:
    """Write ``content`` as the new ``last.pth``, atomically; one there that does not validate is set aside first.

    Stale ``.staging-*`` entries (an earlier save's, cut short) are removed first.

    Raises:
        DiskFullError / CheckpointStorageError: the write (or the set-aside) failed; the previous file is as it was.
    """
    last = model_dir / L.LEGACY_LAST
    step = content["marker"]["step"]
    with storage_errors(model_dir, lambda: tensor_bytes(content), L.LEGACY_LAST, UNPUBLISHED):
        model_dir.mkdir(parents=True, exist_ok=True)
        clean_staging(model_dir)
        if last.exists():  # replaced by the write when it validates
            unpublished = f"the checkpoint of step {step} is not published (nothing of it was written)"
            readable_or_set_aside(last, otherwise=unpublished)
        return _legacy.write(last, content)


def snapshot(model_dir: pathlib.Path, published: pathlib.Path, step: int) -> pathlib.Path:
    """Copy a published checkpoint to ``iter_<step>`` (hard links when possible).

    The copy is built under a staging name and renamed, so a crash never
    leaves a half-copied snapshot under a discoverable name. An existing
    snapshot of the same step (a re-save after resuming) is replaced, or,
    when it does not validate, set aside.
    """
    if storage.is_store(model_dir):
        return _store_publish.snapshot(model_dir, published, step)
    name = f"iter_{step}" if published.is_dir() else f"iter_{step}.pth"
    staging = model_dir / f"{L.STAGING}{name}"
    size = lambda: sum(p.stat().st_size for p in [published, *published.rglob("*")] if p.is_file())
    consequence = f"the checkpoint itself was published as {published.name}, and is intact"
    copying = f"the snapshot {name} (copies where hard links fail)"
    with storage_errors(model_dir, size, copying, consequence), _removed_on_error(staging):
        L.remove(staging)
        if published.is_dir():
            shutil.copytree(published, staging, copy_function=L.link_or_copy)
        else:
            L.link_or_copy(str(published), str(staging))
        target = model_dir / name
        unmade = f"the snapshot {name} is not made (its staging {staging.name} is removed); {consequence}"
        if target.exists() and readable_or_set_aside(target, otherwise=unmade) is not None and published.is_dir():
            L.remove(target)
        if published.is_dir():
            os.rename(staging, target)
        else:
            os.replace(staging, target)
    W.fsync_dir(model_dir)
    return target
