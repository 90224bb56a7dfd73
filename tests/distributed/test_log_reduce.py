"""Two DDP ranks: the training loss logged is rank 0's or the mean over ranks, and the record says which."""

import pytest

from _launch import results, run_ranks

pytestmark = pytest.mark.distributed


def test_a_training_record_holds_rank_0s_outputs_or_their_mean_and_says_which(tmp_path):
    """log_reduce=None: rank 0's loss, over='rank 0'; 'mean': the mean of both ranks' losses, over='mean of 2 ranks'."""
    run_ranks("_log_workers:log_over_ranks", 2, tmp_path, save_dir=str(tmp_path / "run"), tag="log", timeout=90).check()
    zero, one = results(tmp_path, "log", 2)
    for reduce in ("None", "mean"):
        train = [r for r in zero[reduce]["history"] if r["kind"] == "train"]
        assert [r["step"] for r in train] == [3, 6] and one[reduce]["history"] == []
        for record in train:
            mine, theirs = zero[reduce]["seen"][record["step"]], one[reduce]["seen"][record["step"]]
            expected = mine if reduce == "None" else (mine + theirs) / 2
            assert record["loss"] == pytest.approx(expected, rel=1e-12) and mine != theirs
        over = {r["over"] for r in zero[reduce]["history"] if r["kind"] in ("train", "epoch")}
        assert over == ({"rank 0"} if reduce == "None" else {"mean of 2 ranks"})
        assert zero[reduce]["last hook"] == one[reduce]["last hook"] == "progress_bar()"  # rank 0 chose the bar
