"""Receipts: each rank's proof that it wrote into the directory rank 0 publishes.

The multi-rank checks (two nodes whose ``save_dir`` differ) are in
``tests/distributed/test_elastic.py``; these run in one process.
"""

import json
import socket
import time

import pytest
import torch

from pimm_fn.checkpoint import (
    CheckpointStorageError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_checkpoint_async,
)
from pimm_fn.checkpoint import publish as _receipts

WEIGHTS, TRAINER, LOCAL = {"w": torch.arange(3.0)}, {"lr": 0.1}, {"seed": 1}


def test_a_standard_save_publishes_its_receipt_with_rank_world_size_and_host(tmp_path):
    """``last/receipts/rank0`` says which rank of how many wrote the checkpoint, and on which host."""
    info = save_checkpoint(tmp_path, step=3, weights=WEIGHTS, trainer=TRAINER, local=LOCAL)
    receipt = json.loads((info.path / "receipts" / "rank0").read_text())
    assert receipt == {"rank": 0, "world_size": 1, "host": socket.gethostname()}


def test_an_async_save_publishes_its_receipt(tmp_path):
    """The background save writes the receipt too."""
    info = save_checkpoint_async(tmp_path, step=2, weights=WEIGHTS, trainer=TRAINER, local=LOCAL).wait()
    assert (info.path / "receipts" / "rank0").is_file()


def test_receipts_leave_loading_discovery_snapshots_and_retention_as_they_were(tmp_path):
    """A checkpoint with receipts loads, is discovered, snapshots with them and is pruned like any other."""
    for step in (1, 2, 3):
        save_checkpoint(
            tmp_path, step=step, weights=WEIGHTS, trainer=TRAINER, local=LOCAL, snapshot=True, keep_snapshots=2
        )
    latest = latest_checkpoint(tmp_path)
    loaded = load_checkpoint(latest)
    assert latest.step == 3 and loaded.trainer == TRAINER and loaded.local == LOCAL
    assert torch.equal(loaded.weights["w"], WEIGHTS["w"])
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_2", "iter_3"]
    assert (tmp_path / "iter_3" / "receipts" / "rank0").is_file()
    assert not list(tmp_path.glob(".staging-*"))


def test_a_legacy_save_has_no_receipts(tmp_path):
    """The one-file format is written by rank 0 alone from gathered state: nothing to prove."""
    info = save_checkpoint(tmp_path, step=1, weights=WEIGHTS, trainer=TRAINER, local=LOCAL, format="legacy")
    assert info.path.is_file() and not (tmp_path / "receipts").exists()


def test_missing_receipts_names_the_ranks_rank_0_does_not_see_after_the_grace(tmp_path):
    """Of 3 ranks, the one receipt written is found; the other two are reported after waiting the grace."""
    _receipts.write_receipt(tmp_path)
    start = time.monotonic()
    assert _receipts.missing_receipts(tmp_path, 3, grace_s=0.3) == [1, 2]
    assert time.monotonic() - start >= 0.3


def test_missing_receipts_is_empty_at_once_when_every_receipt_is_there(tmp_path):
    """A complete set costs one directory listing, no waiting."""
    _receipts.write_receipt(tmp_path)
    start = time.monotonic()
    assert _receipts.missing_receipts(tmp_path, 1, grace_s=5.0) == []
    assert time.monotonic() - start < 1.0


def test_the_storage_error_names_the_rank_both_hosts_the_path_and_the_fix():
    """The message says which rank's files rank 0 lacks, where, and to put save_dir on shared storage."""
    message = _receipts.receipt_error("/runs/x/model/.staging-last-4", [1, 3], "node-b", "node-a", wrote=True)
    assert message.startswith(
        "save_dir is not shared between nodes: rank 1's files (host node-b) are missing "
        "on rank 0 (host node-a) at /runs/x/model/.staging-last-4 (ranks [1, 3] in all); "
    )
    assert "put save_dir on storage every node sees" in message and "nothing was published" in message


def test_the_storage_error_says_when_a_rank_could_not_write_at_all():
    """A rank that does not see its own receipt either could not write there: the message says so instead."""
    message = _receipts.receipt_error("/runs/x", [1], "node-b", "node-a", wrote=False)
    assert message.startswith("rank 1 (host node-b) could not write its checkpoint files at /runs/x")


def test_the_storage_error_is_a_runtime_error():
    """Code that catches RuntimeError around a save keeps catching it."""
    assert issubclass(CheckpointStorageError, RuntimeError)
    with pytest.raises(RuntimeError, match="not shared"):
        raise CheckpointStorageError("save_dir is not shared between nodes")
