"""Publishing a checkpoint on an fsspec store, where there is no atomic rename: the marker commits it.

Object stores (S3, GCS) rename by copying, one object at a time, so the
staging-and-rename publish of :mod:`._publish` would expose half-copied
directories. Here, as Orbax does, a checkpoint is written under its final
name and ``COMPLETE`` is written last, as one object (a PUT is atomic: the
object exists whole or not at all)::

    rank 0: create last-<step>-<token>/ (a name no earlier save used)
    all   : DCP through its fsspec writer, model.pth beside it, receipts
    rank 0: COMPLETE (each file's size, SHA-256 when asked): now it counts
    rank 0: delete the previous last-*, marker first; copy iter_<step> (marker last); retention

Discovery (:func:`.candidates.candidates`) never looks at a directory of a
store without its marker: a save killed at any instant before ``COMPLETE``
leaves an invisible directory, and the previous checkpoint stays the
latest. Deletion removes the marker first, so a deletion cut short leaves
an invisible directory too; both kinds are deleted after the next
publish. A committed checkpoint whose marker does not validate (damaged)
is never deleted by the library.
"""

from __future__ import annotations

import secrets

from . import _layout as L
from . import validation
from .errors import CheckpointError, storage_errors
from .set_aside import readable_or_set_aside
from .storage import StorePath

__all__ = ["fresh", "publish", "snapshot"]


def fresh(model_dir: StorePath, step: int) -> StorePath:
    """The directory a new checkpoint of ``step`` is written into, under its final (never reused) name."""
    target = model_dir / f"{L.LAST}-{step}-{secrets.token_hex(4)}"
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
            if entry == committed or not (L.STORE_LAST.match(entry.name) or L.ITER_DIR.match(entry.name)):
                continue
            if not (entry / L.MARKER).exists():
                L.remove(entry)  # never committed: invisible to discovery, nothing is lost
            elif L.STORE_LAST.match(entry.name) and _valid(entry):
                L.remove(entry)  # superseded by ``committed``, which is complete
    return committed


def _valid(entry: StorePath) -> bool:
    try:
        validation.validate(entry)
    except CheckpointError:
        return False
    return True


def snapshot(model_dir: StorePath, published: StorePath, step: int) -> StorePath:
    """Copy ``published`` to ``iter_<step>/`` on the store (server-side copies), its marker last.

    An existing snapshot of that step (a re-save after resuming) loses its
    marker first, so it is never seen half-replaced; one that does not
    validate is set aside instead (:mod:`.set_aside`).
    """
    target = model_dir / f"iter_{step}"
    kept = f"the checkpoint itself was published as {published.name}, and is intact"
    with storage_errors(model_dir, 0, f"the snapshot {target.name}", kept):
        earlier = target.files()  # one listing: an earlier snapshot of this step, committed or not (usually none)
        unmade = f"the snapshot {target.name} is not made; {kept}"
        if earlier and (L.MARKER not in earlier or readable_or_set_aside(target, otherwise=unmade) is not None):
            L.remove(target)  # uncommitted (invisible, nothing lost), or a readable snapshot replaced
        L.copy_on_store(published, target)
    return target
