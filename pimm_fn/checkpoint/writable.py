"""Whether a save can write where it writes, asked before the first step rather than found at the first save.

A save creates a staging directory and files in ``model/``, renames it into
place and deletes what it replaces; a ``model/`` this user may not write
(its permissions, a read-only mount, an immutable flag) would fail there,
hours into training. :func:`check_writable` has every rank that writes do
the same once, on a probe (a ``.staging-probe-*`` directory holding one
file, renamed, then deleted; one a crash left, the next save removes), and
every rank raises the same :class:`CheckpointStorageError`, naming each
rank that could not, its host, the path and the OS's reason, before any
step trains. Which ranks write: rank 0 for the legacy format and the best
weights; every rank for the standard format (DCP writes each rank's part).

On an fsspec store (``s3://``) a probe is a small object written under
``model/`` and deleted (a store has no rename; the store's own refusal, a
missing bucket or credentials that may only read, shows there).
"""

from __future__ import annotations

import os
import pathlib
import secrets
import socket

from pimm_fn import dist

from . import _layout as L
from . import storage
from .errors import CheckpointStorageError, cause, unwritable_advice

__all__ = ["check_writable", "probe"]

_PROBE = f"{L.STAGING}probe-"  # a crash's leftover is a .staging-* entry: the next save removes it


def probe(directory) -> None:
    """Create, rename and delete a probe in ``directory`` (a local path or a store's): what a save does there.

    Raises:
        OSError: what the storage refused (a store client's own errors too).
    """
    name = f"{_PROBE}{secrets.token_hex(6)}"
    if storage.is_store(directory):
        target = directory / name
        target.write_bytes(b"pimm_fn write probe\n")
        target.unlink()
        return
    made, renamed = directory / name, directory / f"{name}-renamed"
    os.mkdir(made)
    try:
        (made / "probe").write_bytes(b"pimm_fn write probe\n")
        os.rename(made, renamed)
        os.unlink(renamed / "probe")
        os.rmdir(renamed)
    finally:
        for left in (made, renamed):  # what a refusal left behind (nothing when every step went through)
            L.remove(left)


def check_writable(save_dir, *, every_rank: bool) -> None:
    """Each rank that writes probes ``save_dir/model`` (``save_dir`` itself while there is no ``model/``); collective.

    Args:
        save_dir: a local path or a :class:`~.storage.StorePath`.
        every_rank: every rank writes (the standard format); else rank 0 alone.

    Raises:
        CheckpointStorageError: on every rank, when some rank could not write:
            naming each such rank, its host, the path and the reason, and the fix.
    """
    refused = None
    if every_rank or dist.is_main():
        where = _probed(storage.location(save_dir))
        try:
            probe(where)
        except Exception as exc:  # noqa: BLE001 - an OSError, or a store client's own: said on every rank
            refused = (dist.rank(), socket.gethostname(), str(where.absolute()), cause(exc))  # each node's own view
    found = [r for r in dist.all_gather_object(refused) if r is not None]
    if not found:
        return
    ranks = "; ".join(f"rank {rank} (host {host}) at {where}: {why}" for rank, host, where, why in found)
    directory = found[0][2]
    raise CheckpointStorageError(  # the same on every rank: what each rank found, never this rank's own view
        f"save_dir cannot hold checkpoints: a save creates, renames and deletes files there, and {ranks}. This run "
        f"wrote nothing there and trained no step. {unwritable_advice(directory)}"
    )


def _probed(save_dir) -> "pathlib.Path | storage.StorePath":
    """Where a save writes: ``model/``, or ``save_dir`` while it has none (the first save makes it)."""
    model_dir = save_dir / "model"
    if storage.is_store(save_dir) or model_dir.is_dir():
        return model_dir
    save_dir.mkdir(parents=True, exist_ok=True)  # rank 0 made it with the lock; another node's view may lag
    return save_dir
