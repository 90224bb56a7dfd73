"""Names on disk, and removing or linking a checkpoint by them.

How the files are written so that a crash never leaves one that looks whole
(atomic, staged and background writes, the marker last): :mod:`._safe_writes`.
What the marker records, and the ``CheckpointInfo`` read back from it: :mod:`._marker`.

Layout under a ``model_dir`` (``save_dir/"model"``)::

    last/                   rolling checkpoint, standard format
      model.pth             model weights (torch.save of the full state_dict); a sharded
                            model saved without it has model.pth.skipped instead
      trainer/              torch.distributed.checkpoint directory
      receipts/rank<r>      JSON: rank r wrote its part here (rank, world size, host)
      COMPLETE              JSON marker, written last: step, world size, each file's size
    iter_<step>/            snapshot of a published ``last/`` (hard links)
    last.pth, iter_<step>.pth   the same, legacy one-file format
    model_best.pth (+ .json)    best weights and what made them best
    model_best_<metric>.pth (+ .json)   the same per metric, when several are tracked
    .staging-*              being written; never read, removed at next save
    .retired-*              the previous ``last/`` during a publish
    damaged-*               a checkpoint a save found damaged where it writes, kept (:mod:`.set_aside`)

On an fsspec store (``save_dir="s3://..."``, :mod:`.storage`), which has no
atomic rename, the rolling checkpoint is written under its final name
``last-<step>-<token>/`` and ``COMPLETE`` is written last: a directory
without it is invisible (being written, or left by a crash) and the next
publish deletes it; the previous ``last-*`` is deleted, marker first, once
the new one is committed (:mod:`._store_publish`).

Invariant: a directory counts as a checkpoint only when its ``COMPLETE``
marker parses and every file it lists has the recorded size
(:mod:`.validation`); the marker is written after every file.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil

from . import storage

__all__ = ["best_stem", "is_best_name", "remove", "link_or_copy", "copy_on_store"]

LAST = "last"
LEGACY_LAST = "last.pth"
MARKER = "COMPLETE"
WEIGHTS = "model.pth"
# Stands in for the weights file of a sharded model saved without it: says where the weights are.
WEIGHTS_SKIPPED = "model.pth.skipped"
TRAINER = "trainer"
BEST = "model_best.pth"
BEST_META = "model_best.json"
RECEIPTS = "receipts"


def best_stem(metric: str | None = None) -> str:
    """``model_best``, or ``model_best_<metric>`` (unsafe characters as ``_``) when one file per metric is kept.

    >>> best_stem(), best_stem("val/mIoU")
    ('model_best', 'model_best_val_mIoU')
    """
    if metric is None:
        return "model_best"
    return "model_best_" + re.sub(r"[^A-Za-z0-9_.-]", "_", metric)
STAGING = ".staging-"
RETIRED = ".retired-"
ITER_DIR = re.compile(r"^iter_(\d+)$")
ITER_FILE = re.compile(r"^iter_(\d+)\.pth$")
STORE_LAST = re.compile(r"^last-(\d+)-[0-9a-f]+$")  # the rolling checkpoint on a store, under its final name


def is_best_name(path: pathlib.Path) -> bool:
    """Whether ``path`` is named as a best-model weights file: ``model_best.pth`` or ``model_best_<metric>.pth``."""
    return path.suffix == ".pth" and path.stem.startswith(best_stem())


def remove(path: pathlib.Path) -> None:
    """Delete a checkpoint dir or file; the marker goes first.

    Removing the marker first means a crash half-way through leaves a
    directory that discovery already ignores.
    """
    if storage.is_store(path):
        (path / MARKER).unlink(missing_ok=True)
        path.remove_tree()
        return
    if path.is_dir() and not path.is_symlink():
        (path / MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def link_or_copy(src: str, dst: str) -> None:
    """Hard-link ``src`` to ``dst``; copy where links are not supported."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def copy_on_store(source, target) -> None:
    """Copy a checkpoint directory on an fsspec store to ``target`` (server-side copies), its marker last, if any.

    The marker commits on a store: until it is copied, ``target`` is invisible.
    """
    listed = source.files()  # one listing: the marker is in it when there is one
    files = sorted(rel for rel in listed if rel != MARKER)
    if files:
        source.fs.copy([f"{source.path}/{rel}" for rel in files], [f"{target.path}/{rel}" for rel in files])
    if MARKER in listed:
        source.fs.copy(f"{source.path}/{MARKER}", f"{target.path}/{MARKER}")
