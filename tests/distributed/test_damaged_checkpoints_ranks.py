"""On two gloo ranks a damaged checkpoint is skipped or refused alike everywhere, and a full disk stops every rank.

One launch (``_fault_workers:faults``, hard timeout) runs every case; see
``tests/checkpoint/test_damaged_checkpoints.py`` and ``test_disk_full.py``
for the full matrix on one rank.
"""

import pytest

from _fault_workers import DAMAGES, FULL
from _launch import results, run_ranks

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults")
    run_ranks("_fault_workers:faults", 2, out, timeout=150, grace=20, save_dir=str(out / "runs"), tag="faults").check()
    return results(out, "faults", 2)


@pytest.mark.parametrize("case", [f"{name}:{how}" for name, how in DAMAGES])
def test_auto_resume_skips_a_damaged_checkpoint_on_every_rank_alike(ranks, case):
    """Every rank passes over the damaged last/ and resumes the same whole checkpoint (iter_12), bit for bit."""
    for rank in ranks:
        found = rank["damaged"][case]
        assert (found["auto_step"], found["auto_same"]) == (12, True), (rank["rank"], found)


@pytest.mark.parametrize("case", [f"{name}:{how}" for name, how in DAMAGES])
def test_resume_from_a_damaged_path_raises_the_same_checkpoint_error_on_every_rank(ranks, case):
    """resume=<damaged last/> raises CheckpointError on both ranks, naming the same checkpoint and file."""
    errors = [rank["damaged"][case]["explicit"] for rank in ranks]
    assert errors[0] is not None and errors[0] == errors[1], errors
    path, file, message = errors[0]
    assert path.endswith("/model/last") and file == case.split(":")[0] and "python -m pimm_fn ls" in message, message


@pytest.mark.parametrize("case", [f"{site}:{background}" for site, background in FULL])
def test_a_full_disk_on_one_rank_raises_disk_full_error_on_every_rank_and_resume_is_exact(ranks, case):
    """ENOSPC in one rank's write is a DiskFullError on both ranks; no staging is left; resume reaches the same weights."""
    assert any(rank["full"][case]["hit"] for rank in ranks), "the full disk was never hit"
    for rank in ranks:
        found = rank["full"][case]
        kind, message, full = found["error"]
        assert full and "No space left on device" in message and " bytes)" in message, (rank["rank"], found)
        assert found["staging"] == [] and found["resumed_at"] == 4 and found["same"], (rank["rank"], found)
