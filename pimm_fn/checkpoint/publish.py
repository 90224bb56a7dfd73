"""Publishing a finished checkpoint atomically: a rename locally, the marker's commit on a store, and the receipts that prove every rank wrote.

All functions here run on the main rank only, on a ``model_dir`` that no
other process writes to at the same time (what every rank leaves for rank 0
to check first, its receipt: :mod:`pimm_fn.checkpoint.publish`).

Publishing a standard checkpoint is two renames::

    last/           -> .retired-last-<old step>/
    .staging-last-<step>/ -> last/

then the retired directory is deleted. Between the renames there is no
``last/`` but the retired one is complete and discovery reads it, so at
every instant some complete checkpoint at least as new as the previous one
is discoverable. A ``last/`` (or snapshot of the same step) that does not
validate is never retired or replaced but set aside (:mod:`pimm_fn.checkpoint.validation`). Legacy files need a single ``os.replace``. On an fsspec
store there is no rename: :mod:`pimm_fn.checkpoint.publish` writes under the final name
and the marker commits (each function here hands a store over to it).

Publishing a checkpoint on an fsspec store, where there is no atomic rename: the marker commits it.

Object stores (S3, GCS) rename by copying, one object at a time, so the
staging-and-rename publish of :mod:`pimm_fn.checkpoint.publish` would expose half-copied
directories. Here, as Orbax does, a checkpoint is written under its final
name and ``COMPLETE`` is written last, as one object (a PUT is atomic: the
object exists whole or not at all)::

    rank 0: create last-<step>-<token>/ (a name no earlier save used)
    all   : DCP through its fsspec writer, model.pth beside it, receipts
    rank 0: COMPLETE (each file's size, SHA-256 when asked): now it counts
    rank 0: delete the previous last-*, marker first; copy iter_<step> (marker last); retention

Discovery (:func:`pimm_fn.checkpoint.discovery.candidates`) never looks at a directory of a
store without its marker: a save killed at any instant before ``COMPLETE``
leaves an invisible directory, and the previous checkpoint stays the
latest. Deletion removes the marker first, so a deletion cut short leaves
an invisible directory too; both kinds are deleted after the next
publish. A committed checkpoint whose marker does not validate (damaged)
is never deleted by the library.

Receipts: proof for rank 0 that every rank wrote its part of a checkpoint where rank 0 publishes it.

Before its DCP write every rank leaves ``receipts/rank<r>`` in the staging
directory, and after it (DCP's ``save`` returns on no rank before every
rank's files are written) :func:`check_receipts` has rank 0 look for all
of them. A receipt rank 0 cannot see means that rank wrote elsewhere: a
``save_dir`` on a node's own disk. Then every rank raises
:class:`CheckpointStorageError` and nothing is published, instead of rank 0
publishing a checkpoint that lacks the other nodes' files.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import shutil
import socket
import time
from collections.abc import Iterator

from pimm_fn import dist
from pimm_fn.checkpoint import files, storage, validation
from pimm_fn.checkpoint.errors import (
    CheckpointError,
    CheckpointStorageError,
    storage_error,
    storage_errors,
    tensor_bytes,
)
from pimm_fn.checkpoint.files import manifest
from pimm_fn.checkpoint.formats import one_file
from pimm_fn.checkpoint.storage import StorePath
from pimm_fn.checkpoint.validation import readable_or_set_aside

__all__ = [
    "fresh",
    "publish",
    "store_snapshot",
    "CheckpointStorageError",
    "write_receipt",
    "missing_receipts",
    "check_receipts",
    "receipt_error",
    "RECEIPT_GRACE_S",
]


def fresh(model_dir: StorePath, step: int) -> StorePath:
    """The directory a new checkpoint of ``step`` is written into, under its final (never reused) name."""
    target = model_dir / f"{files.LAST}-{step}-{secrets.token_hex(4)}"
    target.mkdir(parents=True, exist_ok=True)
    return target


def publish(model_dir: StorePath, committed: StorePath, step: int) -> StorePath:
    """After ``committed``'s marker is written: delete every other rolling checkpoint and any uncommitted leftover.

    An older ``last-*`` goes only when it validates (marker first); a
    directory without a marker was never a checkpoint (a save or a deletion
    cut short). A damaged one is left for ``python -m pimm_fn verify``.

    Raises:
        CheckpointStorageError: a deletion was refused; ``committed`` is published all the same.
    """
    kept = f"the checkpoint of step {step} is published as {committed.name}, and is intact"
    with storage_errors(model_dir, 0, "the checkpoints it supersedes", kept, doing="deleting"):
        for entry in model_dir.iterdir():
            if entry == committed or not (files.STORE_LAST.match(entry.name) or files.ITER_DIR.match(entry.name)):
                continue
            if not (entry / files.MARKER).exists():
                files.remove(entry)  # never committed: invisible to discovery, nothing is lost
            elif files.STORE_LAST.match(entry.name) and _valid(entry):
                files.remove(entry)  # superseded by ``committed``, which is complete
    return committed


def _valid(entry: StorePath) -> bool:
    try:
        validation.validate(entry)
    except CheckpointError:
        return False
    return True


def store_snapshot(model_dir: StorePath, published: StorePath, step: int) -> StorePath:
    """Copy ``published`` to ``iter_<step>/`` on the store (server-side copies), its marker last.

    An existing snapshot of that step (a re-save after resuming) loses its
    marker first, so it is never seen half-replaced; one that does not
    validate is set aside instead (:mod:`pimm_fn.checkpoint.validation`).
    """
    target = model_dir / f"iter_{step}"
    kept = f"the checkpoint itself was published as {published.name}, and is intact"
    with storage_errors(model_dir, 0, f"the snapshot {target.name}", kept):
        earlier = target.files()  # one listing: an earlier snapshot of this step, committed or not (usually none)
        unmade = f"the snapshot {target.name} is not made; {kept}"
        if earlier and (files.MARKER not in earlier or readable_or_set_aside(target, otherwise=unmade) is not None):
            files.remove(target)  # uncommitted (invisible, nothing lost), or a readable snapshot replaced
        files.copy_on_store(published, target)
    return target


UNPUBLISHED = "nothing was published: the previous checkpoint is intact and stays the latest"


def removed(staging: storage.Location) -> str:
    """What a failed save's error says it left: its staging directory removed, the previous checkpoint the latest."""
    return f"its staging directory {staging.name} is removed and {UNPUBLISHED}"


def fresh_staging(model_dir: storage.Location, step: int) -> storage.Location:
    """Remove every stale ``.staging-*`` entry, then create an empty staging dir.

    Stale entries are what an earlier save left when it crashed; they are
    never discovered, so deleting them loses nothing.

    Raises:
        DiskFullError: not even the directory could be made.
    """
    staging = model_dir / f"{files.STAGING}{files.LAST}-{step}"
    with storage_errors(model_dir, 0, f"the staging directory {staging.name}", UNPUBLISHED):
        if storage.is_store(model_dir):
            return fresh(model_dir, step)
        model_dir.mkdir(parents=True, exist_ok=True)
        clean_staging(model_dir)
        staging.mkdir()
    return staging


def discard(staging: storage.Location, weights_file: files.BackgroundWrite | None = None) -> None:
    """After a failed save (main rank): wait for the weights write, then delete the staging directory.

    Nothing reads it, and a save that ran out of space must give the space back.
    """
    if weights_file is not None:
        weights_file.join()
    if dist.is_main():
        files.remove(staging)


def clean_staging(model_dir: pathlib.Path) -> None:
    """Delete every ``.staging-*`` file or directory under ``model_dir``."""
    for entry in model_dir.glob(f"{files.STAGING}*"):
        files.remove(entry)


@contextlib.contextmanager
def _removed_on_error(staging: storage.Location) -> Iterator[None]:
    """Remove ``staging`` when what runs inside fails: an unpublished save leaves nothing behind."""
    try:
        yield
    except BaseException:
        files.remove(staging)
        raise


def publish_dir(model_dir: storage.Location, staging: storage.Location, step: int) -> storage.Location:
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
        assert storage.is_store(staging)  # inside model_dir
        return publish(model_dir, staging, step)
    last = model_dir / files.LAST
    what = f"the checkpoint of step {step}"
    with storage_errors(model_dir, 0, what, removed(staging), doing="publishing"), _removed_on_error(staging):
        unpublished = f"{what} is not published (its staging directory {staging.name} is removed)"
        old = readable_or_set_aside(last, otherwise=unpublished) if last.exists() else None
        if old is not None:
            retired = model_dir / f"{files.RETIRED}{files.LAST}-{old.step}"
            files.remove(retired)
            os.rename(last, retired)
        os.rename(staging, last)
    files.fsync_dir(model_dir)
    for retired in model_dir.glob(f"{files.RETIRED}*"):
        files.remove(retired)
    return last


def publish_staged(
    model_dir: storage.Location,
    staging: storage.Location,
    step: int,
    world_size: int,
    metrics: dict | None = None,
    *,
    weights_file: files.BackgroundWrite | None = None,
    digests: bool = False,
) -> storage.Location:
    """Mark a staging directory whose files are all durable complete, and publish it (main rank).

    Waits for ``weights_file`` first, then makes the trainer directory's
    entries durable (DCP fsyncs its files but not their directory), writes
    ``COMPLETE`` with every file's size (and SHA-256 with ``digests``: the
    weights file's as ``weights_file`` hashed it while writing, the others'
    by :func:`pimm_fn.checkpoint.files.manifest`), fsynced with the staging directory,
    then :func:`publish_dir` renames.

    Raises:
        DiskFullError: the weights file or the marker did not fit; the
            staging directory is removed, the previous checkpoint intact.
    """
    try:
        if weights_file is not None:
            weights_file.result()
        files.fsync_dir(staging / files.TRAINER)
        hashed = weights_file.sha256 if weights_file is not None else None  # while it was written: no second read
        known = {weights_file.path.name: hashed} if weights_file is not None and hashed else None
        recorded = manifest(staging, digests=digests, known=known)
        files.write_marker(staging, step, world_size, staged=True, metrics=metrics, files=recorded)
    except BaseException as exc:
        nbytes = _staged_bytes(staging, weights_file)
        discard(staging)
        converted = storage_error(exc, model_dir, nbytes, f"the checkpoint of step {step}", removed(staging))
        if converted is exc:
            raise
        raise converted from exc
    return publish_dir(model_dir, staging, step)


def _staged_bytes(staging: storage.Location, weights_file: files.BackgroundWrite | None) -> int:
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
    last = model_dir / files.LEGACY_LAST
    step = content["marker"]["step"]
    with storage_errors(model_dir, lambda: tensor_bytes(content), files.LEGACY_LAST, UNPUBLISHED):
        model_dir.mkdir(parents=True, exist_ok=True)
        clean_staging(model_dir)
        if last.exists():  # replaced by the write when it validates
            unpublished = f"the checkpoint of step {step} is not published (nothing of it was written)"
            readable_or_set_aside(last, otherwise=unpublished)
        return one_file.write(last, content)


def snapshot(model_dir: storage.Location, published: storage.Location, step: int) -> storage.Location:
    """Copy a published checkpoint to ``iter_<step>`` (hard links when possible).

    The copy is built under a staging name and renamed, so a crash never
    leaves a half-copied snapshot under a discoverable name. An existing
    snapshot of the same step (a re-save after resuming) is replaced, or,
    when it does not validate, set aside.
    """
    if storage.is_store(model_dir):
        assert storage.is_store(published)  # inside model_dir
        return store_snapshot(model_dir, published, step)
    assert not storage.is_store(published)  # inside model_dir, a local path
    name = f"iter_{step}" if published.is_dir() else f"iter_{step}.pth"
    staging = model_dir / f"{files.STAGING}{name}"
    size = lambda: sum(p.stat().st_size for p in [published, *published.rglob("*")] if p.is_file())
    consequence = f"the checkpoint itself was published as {published.name}, and is intact"
    copying = f"the snapshot {name} (copies where hard links fail)"
    with storage_errors(model_dir, size, copying, consequence), _removed_on_error(staging):
        files.remove(staging)
        if published.is_dir():
            shutil.copytree(published, staging, copy_function=files.link_or_copy)
        else:
            files.link_or_copy(str(published), str(staging))
        target = model_dir / name
        unmade = f"the snapshot {name} is not made (its staging {staging.name} is removed); {consequence}"
        if target.exists() and readable_or_set_aside(target, otherwise=unmade) is not None and published.is_dir():
            files.remove(target)
        if published.is_dir():
            os.rename(staging, target)
        else:
            os.replace(staging, target)
    files.fsync_dir(model_dir)
    return target


# How long rank 0 waits for a receipt it does not see yet (storage that shows
# another client's new files late). Only a failing check ever waits.
RECEIPT_GRACE_S = 2.0


def write_receipt(staging: storage.Location) -> None:
    """Leave ``receipts/rank<r>`` in ``staging``: proof for rank 0 that this rank wrote here, and from which host.

    A failed write is not raised here (the other ranks are about to enter
    DCP's collective write): the missing receipt fails the check instead.
    """
    text = json.dumps({"rank": dist.rank(), "world_size": dist.world_size(), "host": socket.gethostname()})
    receipts = staging / files.RECEIPTS
    try:
        receipts.mkdir(parents=True, exist_ok=True)
        files.durable_write(receipts / f"rank{dist.rank()}", lambda f: f.write(text.encode()))
    except OSError:
        pass


def missing_receipts(staging: storage.Location, world_size: int, grace_s: float = RECEIPT_GRACE_S) -> list[int]:
    """The ranks whose receipt this process does not see in ``staging``, after waiting up to ``grace_s``."""
    receipts = staging / files.RECEIPTS
    try:
        present = {entry.name for entry in receipts.iterdir()}
    except OSError:
        present = set()
    missing = [r for r in range(world_size) if f"rank{r}" not in present]
    deadline = time.monotonic() + grace_s
    while missing and time.monotonic() < deadline:
        time.sleep(0.1)
        missing = [r for r in missing if not (receipts / f"rank{r}").is_file()]
    return missing


def check_receipts(staging: storage.Location, group=None) -> None:
    """Raise :class:`CheckpointStorageError` on every rank unless rank 0 sees every rank's receipt.

    Collective (one broadcast; a second one, from the first missing rank,
    only when the check fails), so every rank raises the same error.

    Raises:
        CheckpointStorageError: naming the first missing rank, both hosts and the path.
    """
    world = dist.world_size()
    if world == 1:
        return
    # Rank 0's absolute path: a relative save_dir resolves against each node's own working directory.
    verdict = (
        (missing_receipts(staging, world), socket.gethostname(), str(staging.absolute())) if dist.is_main() else None
    )
    verdict = dist.broadcast_object(verdict, group=group)
    assert verdict is not None  # rank 0's, which it always sends
    missing, main_host, where = verdict
    if not missing:
        return
    # The first missing rank says where it is, and whether it sees its own receipt.
    mine = staging / files.RECEIPTS / f"rank{dist.rank()}"
    report = (socket.gethostname(), mine.is_file()) if dist.rank() == missing[0] else None
    report = dist.broadcast_object(report, src=missing[0], group=group)
    assert report is not None  # the first missing rank's, which it always sends
    host, wrote = report
    raise CheckpointStorageError(receipt_error(where, missing, host, main_host, wrote))


def receipt_error(staging: str, missing: list[int], host: str, main_host: str, wrote: bool) -> str:
    """The message of a failed receipt check: who is missing, on which hosts, and the fix."""
    first = missing[0]
    others = f" (ranks {missing} in all)" if len(missing) > 1 else ""
    if not wrote:
        return (
            f"rank {first} (host {host}) could not write its checkpoint files at {staging}{others}: "
            "check that save_dir is writable from every node; nothing was published"
        )
    return (
        f"save_dir is not shared between nodes: rank {first}'s files (host {host}) are missing on rank 0 "
        f"(host {main_host}) at {staging}{others}; put save_dir on storage every node sees (a network file system), "
        "since rank 0 publishes the checkpoint that every rank wrote into; nothing was published"
    )
