"""Applying a retention policy to the ``iter_<step>`` snapshots of a model_dir, after a publish.

The decision is the pure :func:`pimm_fn.core.retention.decide`; this module
reads what it needs from disk (each complete snapshot's step and the metrics
its marker recorded) and deletes what it rules out. Main rank only, after the
new checkpoint is published, so a complete checkpoint at least as new as
every deleted one already exists.

Each deletion is one atomic rename out of discovery's sight (to
``.staging-removed-<name>``) before the files go: a crash mid-way leaves a
``.staging-*`` entry that discovery never reads and the next save deletes,
never a half-deleted snapshot under a discoverable name. ``last``,
``last.pth``, ``model_best*`` files and snapshots that are not complete are
never touched, and the newest complete snapshot is kept whenever it is newer
than the checkpoint just published. On an fsspec store (no rename) a
snapshot's ``COMPLETE`` is deleted first, which hides it as the rename does.
"""

from __future__ import annotations

import os
from typing import Any, cast

from pimm_fn.checkpoint import files, storage, validation
from pimm_fn.checkpoint.errors import storage_errors
from pimm_fn.checkpoint.files import info_from_marker
from pimm_fn.checkpoint.formats import one_file
from pimm_fn.core import retention

REMOVING = f"{files.STAGING}removed-"


def marker_of(path: storage.Location) -> dict[str, Any]:
    """The completion marker of a checkpoint directory or legacy file, validated.

    Raises:
        ValueError / OSError: the checkpoint is not complete or not readable.
    """
    return _directory_marker(path) if path.is_dir() else _file_marker(path)


def _directory_marker(path: storage.Location) -> dict[str, Any]:
    payload = validation.read_marker(path)[1]  # read once, then its files checked
    validation.check_files(path, payload, False)
    return payload


def _file_marker(path: storage.Location) -> dict[str, Any]:
    content = one_file._load(path, mmap=True)  # the marker only: tensors stay on disk
    marker = content.get("marker") if isinstance(content, dict) else None
    info_from_marker(path, marker, "legacy")
    return cast("dict[str, Any]", marker)  # info_from_marker refused anything but a JSON object


def on_disk(model_dir: storage.Location) -> list[tuple[retention.Snapshot, storage.Location]]:
    """Each complete snapshot under ``model_dir`` with its path, oldest first (one per step)."""
    found: dict[int, tuple[retention.Snapshot, storage.Location]] = {}
    entries: list[storage.Location] = sorted(model_dir.glob("iter_*"), key=lambda p: p.name)
    for entry in entries:
        directory = entry.is_dir()  # asked once: on a store each question is a request
        match = (files.ITER_DIR if directory else files.ITER_FILE).match(entry.name)
        if not match:
            continue
        try:
            marker = _directory_marker(entry) if directory else _file_marker(entry)
        except (OSError, ValueError):
            continue  # not complete: never counted, never deleted here (`python -m pimm_fn verify` reports it)
        metrics = marker.get("metrics")  # absent in markers written before metrics were recorded
        snapshot = retention.Snapshot(int(match.group(1)), metrics if isinstance(metrics, dict) else {})
        found.setdefault(snapshot.step, (snapshot, entry))  # both formats at one step: the first is decided on
    return [found[step] for step in sorted(found)]


def retain(model_dir: storage.Location, policy, published_step: int) -> list[storage.Location]:
    """Delete the snapshots ``policy`` does not keep; returns their paths, oldest first.

    Args:
        model_dir: the checkpoint root.
        policy: a retention policy, or ``None`` to keep everything.
        published_step: the step of the checkpoint just published.
    """
    if policy is None:
        return []
    snaps = on_disk(model_dir)
    paths = {snapshot.step: path for snapshot, path in snaps}
    newest = max(paths, default=None)
    protect = (newest,) if newest is not None and newest > published_step else ()
    decision = retention.decide(policy, [snapshot for snapshot, _ in snaps], protect=protect)
    doomed = [paths[snapshot.step] for snapshot in decision.remove]
    what = f"the snapshot(s) the retention policy rules out ({', '.join(p.name for p in doomed)})"
    kept = f"the checkpoint of step {published_step} is published and intact; a snapshot not yet deleted is kept"
    with storage_errors(model_dir, 0, what, kept, doing="deleting"):
        if storage.is_store(model_dir):  # no rename there: the marker goes first, which hides it at once
            for path in doomed:
                files.remove(path)
            return doomed
        moved = []
        for path in doomed:
            hidden = model_dir / f"{REMOVING}{path.name}"
            files.remove(hidden)
            os.rename(path, hidden)
            moved.append(hidden)
    if moved:
        files.fsync_dir(model_dir)
    for hidden in moved:
        files.remove(hidden)
    return doomed
