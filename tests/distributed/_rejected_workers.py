"""Worker functions: resume='auto' over rejected checkpoints, and a held save_dir, on several ranks.

One launch (``_rejected_workers:rejected``) runs every case in turn: a run is
saved once, then for each case rank 0 makes a damaged copy (or plants a lock
held by a live process, the launching test's), every rank tries
``resume="auto"`` on it, and records what it raised, how long it took, and
(rank 0) whether any byte under the copy changed.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import time

import pimm_fn as pf
from _fault_workers import _build
from _disk_faults import hashes as _hashes  # on the path _fault_workers adds
from _workers import _dump
from pimm_fn import dist
from pimm_fn.checkpoint import lock

CASES = ["all_damaged", "rank1_only", "marker_lost", "locked"]


def _garbage(path: pathlib.Path) -> None:
    path.write_bytes(bytes(range(256)) * (path.stat().st_size // 256) + bytes(path.stat().st_size % 256))


def _prepare(case: str, saved: pathlib.Path, copy: pathlib.Path) -> None:
    """Rank 0: the copy of ``saved`` that ``case`` resumes from."""
    shutil.copytree(saved, copy)
    model = copy / "model"
    if case == "all_damaged":
        for entry in model.iterdir():
            _garbage(entry / "trainer" / ".metadata")
        return
    if case == "locked":  # held by the test that launched the ranks: a live process of this host
        record = {"host": socket.gethostname(), "pid": os.getppid(), "since": time.time() - 5, "token": "theirs"}
        (copy / lock.LOCK_NAME).write_text(json.dumps(record))
        return
    for snapshot in model.glob("iter_*"):
        shutil.rmtree(snapshot)
    if case == "rank1_only":  # rank 1's data file at the same size: the marker's sizes pass, reading it fails
        _garbage(model / "last" / "trainer" / "__1_0.distcp")
    elif case == "marker_lost":
        (model / "last" / "COMPLETE").unlink()


def rejected(rank, world, out, *, save_dir, tag):
    """Save a run, then try resume='auto' on each case's copy; record what each rank raised."""
    root = pathlib.Path(save_dir)
    _build(rank, world, root / "saved")[1]()
    result = {"rank": rank}
    for case in CASES:
        copy = root / case
        if rank == 0:
            _prepare(case, root / "saved", copy)
        dist.barrier()
        before = _hashes(copy) if rank == 0 else None
        start = time.monotonic()
        try:
            _build(rank, world, copy, resume="auto")
            found = {"error": None}
        except (pf.CheckpointError, pf.SaveDirLockError) as exc:
            found = {"error": [type(exc).__name__, str(exc)], "rejected": getattr(exc, "rejected", None)}
        found["seconds"] = time.monotonic() - start
        dist.barrier()
        found["unchanged"] = _hashes(copy) == before if rank == 0 else None
        result[case] = found
    return _dump(out, tag, rank, result)
