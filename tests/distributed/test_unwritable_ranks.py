"""On two gloo ranks, a save_dir that one rank cannot write stops every rank before the first step, naming that rank.

Each rank is given its own save_dir, as two nodes whose mounts differ see one: rank 1's ``model/`` is made
immutable (``tests/checkpoint/_disk_faults.unwritable``, real for root too). One launch, hard timeout; the
one-rank cases are ``tests/checkpoint/test_writable.py``.
"""

import pathlib
import sys

import pytest

from _launch import results, run_ranks

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "checkpoint"))
from _disk_faults import unwritable, why_not_unwritable  # noqa: E402

pytestmark = pytest.mark.distributed


def test_a_rank_that_cannot_write_stops_every_rank_alike_and_only_where_that_rank_writes(tmp_path):
    """The standard format (every rank writes its part) raises the same CheckpointStorageError on both ranks, naming
    rank 1, its path and the reason; the legacy format (rank 0 writes alone) builds, rank 1's save_dir untouched."""
    why = why_not_unwritable(tmp_path)
    if why:
        pytest.skip(why)
    node0, node1 = tmp_path / "node0" / "run", tmp_path / "node1" / "run"
    (node1 / "model").mkdir(parents=True)
    out = tmp_path / "out"
    with unwritable(node1 / "model"):
        run_ranks(
            "_fault_workers:unwritable",
            2,
            out,
            timeout=120,
            grace=20,
            save_dirs=[str(node0), str(node1)],
            tag="unwritable",
        ).check()
    ranks = results(out, "unwritable", 2)
    errors = [rank["standard"] for rank in ranks]
    assert errors[0] is not None and errors[0] == errors[1], errors
    kind, message = errors[0]
    assert kind == "CheckpointStorageError", message
    assert "rank 1 (host " in message and f"at {node1 / 'model'}: PermissionError" in message, message
    assert "rank 0 (host" not in message and "trained no step" in message, message
    assert [rank["legacy"] for rank in ranks] == [None, None]
    assert sorted(p.name for p in node1.rglob("*")) == ["model"]
