"""log_reduce='mean' checks that every rank logged the same training record, and fails on every rank if not."""

import pytest

from _launch import results, run_ranks

pytestmark = pytest.mark.distributed


def test_ranks_logging_different_records_fail_together_naming_each_record(tmp_path):
    """Rank 1 logs one more name: both ranks raise at step 2 naming both records; equal names average as before."""
    run_ranks(
        "_log_check_workers:differing_records", 2, tmp_path, save_dir=str(tmp_path / "run"), tag="check", timeout=90
    ).check()
    zero, one = results(tmp_path, "check", 2)
    for rank in (zero, one):
        failed = rank["names"]
        # the rank told second may get PeerFailureError, a CollectiveDivergenceError quoting the first's
        assert failed["error"] in ("CollectiveDivergenceError", "PeerFailureError") and failed["step"] == 2
        assert "rank 0: step 2 'train' with ['loss', 'lr']" in failed["message"]
        assert "rank 1: step 2 'train' with ['extra', 'loss', 'lr']" in failed["message"]
    assert any("pass pimm_fn.Watching(log_reduce=None)" in rank["names"]["message"] for rank in (zero, one))
    train = [r for r in zero["same"]["history"] if r["kind"] == "train"]
    assert zero["same"]["step"] == one["same"]["step"] == 6 and [r["extra"] for r in train] == [0.5, 0.5, 0.5]
