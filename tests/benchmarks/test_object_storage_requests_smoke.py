"""The object-storage benchmark's request count runs end to end on the tests' S3 server (no timing is asserted)."""

import pathlib
import sys

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import _s3  # noqa: E402


def test_one_save_with_retention_is_counted_by_operation():
    """Every request is counted by its operation, the writes and the snapshot removed among them."""
    from benchmarks.object_storage import save_requests

    with _s3.s3_server():
        counts = save_requests(_s3.new_bucket())
    assert counts["total"] == sum(n for op, n in counts.items() if op != "total")
    assert counts["PutObject"] >= 4 and counts["DeleteObjects"] >= 1  # the save's files, and iter_2 removed
