"""On two gloo ranks resume='auto' over rejected checkpoints, or into a held save_dir, raises alike on every rank,
within seconds, and leaves every byte on disk as it was (``_rejected_workers:rejected``, one launch)."""

import pytest

from _launch import results, run_ranks
from _rejected_workers import CASES

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("rejected")
    run_ranks(
        "_rejected_workers:rejected", 2, out, timeout=150, grace=20, save_dir=str(out / "runs"), tag="rejected"
    ).check()
    return results(out, "rejected", 2)


@pytest.mark.parametrize("case", CASES)
def test_every_rank_raises_the_same_error_quickly_and_nothing_changes(ranks, case):
    """Both ranks raise the same error (no rank starts fresh, none waits), in seconds; the copy is byte-identical."""
    found = [rank[case] for rank in ranks]
    assert found[0]["error"] is not None and found[0]["error"] == found[1]["error"], found
    assert all(f["seconds"] < 10 for f in found), [f["seconds"] for f in found]
    assert found[0]["unchanged"] is True, found[0]


def test_what_each_error_names(ranks):
    """Each rejected checkpoint is named with its reason (one found by reading, with its rank); the lock, its holder."""
    rank0 = ranks[0]
    kind, message = rank0["all_damaged"]["error"]
    assert kind == "NoIntactCheckpointError" and [r[0].rsplit("/", 1)[1] for r in rank0["all_damaged"]["rejected"]] == [
        "last",
        "iter_12",
        "iter_8",
        "iter_4",
    ], message
    read = rank0["rank1_only"]["error"][1]  # sizes right: found only when read, and agreed by every rank
    assert "trainer/__1_0.distcp does not read back" in read and "(on rank " in read, read
    assert "COMPLETE is missing" in rank0["marker_lost"]["error"][1]
    kind, message = rank0["locked"]["error"]
    assert kind == "SaveDirLockError" and "is in use by another run (pid " in message, message
