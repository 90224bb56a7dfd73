"""Receipts: proof for rank 0 that every rank wrote its part of a checkpoint where rank 0 publishes it.

Before its DCP write every rank leaves ``receipts/rank<r>`` in the staging
directory, and after it (DCP's ``save`` returns on no rank before every
rank's files are written) :func:`check_receipts` has rank 0 look for all
of them. A receipt rank 0 cannot see means that rank wrote elsewhere: a
``save_dir`` on a node's own disk. Then every rank raises
:class:`CheckpointStorageError` and nothing is published, instead of rank 0
publishing a checkpoint that lacks the other nodes' files.
"""

from __future__ import annotations

import json
import pathlib
import socket
import time

from pimm_fn import dist

from . import _layout as L
from . import _safe_writes as W
from .errors import CheckpointStorageError

__all__ = ["write_receipt", "missing_receipts", "check_receipts", "receipt_error", "RECEIPT_GRACE_S"]

# How long rank 0 waits for a receipt it does not see yet (storage that shows
# another client's new files late). Only a failing check ever waits.
RECEIPT_GRACE_S = 2.0

def write_receipt(staging: pathlib.Path) -> None:
    """Leave ``receipts/rank<r>`` in ``staging``: proof for rank 0 that this rank wrote here, and from which host.

    A failed write is not raised here (the other ranks are about to enter
    DCP's collective write): the missing receipt fails the check instead.
    """
    text = json.dumps({"rank": dist.rank(), "world_size": dist.world_size(), "host": socket.gethostname()})
    receipts = staging / L.RECEIPTS
    try:
        receipts.mkdir(parents=True, exist_ok=True)
        W.durable_write(receipts / f"rank{dist.rank()}", lambda f: f.write(text.encode()))
    except OSError:
        pass


def missing_receipts(staging: pathlib.Path, world_size: int, grace_s: float = RECEIPT_GRACE_S) -> list[int]:
    """The ranks whose receipt this process does not see in ``staging``, after waiting up to ``grace_s``."""
    receipts = staging / L.RECEIPTS
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


def check_receipts(staging: pathlib.Path, group=None) -> None:
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
    verdict = (missing_receipts(staging, world), socket.gethostname(), str(staging.absolute())) if dist.is_main() else None
    missing, main_host, where = dist.broadcast_object(verdict, group=group)
    if not missing:
        return
    # The first missing rank says where it is, and whether it sees its own receipt.
    mine = staging / L.RECEIPTS / f"rank{dist.rank()}"
    report = (socket.gethostname(), mine.is_file()) if dist.rank() == missing[0] else None
    host, wrote = dist.broadcast_object(report, src=missing[0], group=group)
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
