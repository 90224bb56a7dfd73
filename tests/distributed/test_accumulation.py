"""Gradient accumulation under DDP: ranks sync gradients once per optimizer step, not once per micro-batch."""

import pytest
import torch

from _launch import results, run_ranks
from _workers import MAX_EPOCHS

pytestmark = pytest.mark.distributed
BATCHES_PER_RANK = 6  # 48 samples, 2 ranks, batch 4


def test_accumulation_all_reduces_once_per_optimizer_step_and_ranks_agree(tmp_path):
    """accumulate=3 on 2 ranks: one gradient all-reduce per optimizer step, and both ranks end with equal weights."""
    run_ranks("_step_workers:accumulate", 2, tmp_path, timeout=120, k=3, tag="k3").check()
    ranks = results(tmp_path, "k3", 2)
    steps = BATCHES_PER_RANK // 3 * MAX_EPOCHS
    for rank in ranks:
        assert rank["global_step"] == rank["optimizer_steps"] == steps
        assert rank["calls"] == steps * rank["buckets"]  # not micro-batches * buckets
    assert all(torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]) for name in ranks[0]["weights"])


def test_the_supervised_step_under_ddp_skips_a_nan_on_every_rank_and_sums_up_every_ranks_samples(tmp_path):
    """TrainStep(loss_fn=, accumulate=2, clip_grad_norm=) with on_nonfinite='skip' on 2 ranks: a NaN sample on one
    rank's shard leaves that update out on both (equal, finite weights), and the state's summary counts the samples
    of both ranks."""
    run_ranks("_step_workers:supervised", 2, tmp_path, timeout=120, tag="sup").check()
    ranks = results(tmp_path, "sup", 2)
    steps = BATCHES_PER_RANK // 2 * MAX_EPOCHS
    for rank in ranks:
        assert rank["global_step"] == steps
        assert len(rank["skips"]) == MAX_EPOCHS, rank["skips"]  # the NaN sample once an epoch, on one rank or the other
        assert f", {48 * MAX_EPOCHS} samples on 2 ranks;" in rank["summary"], rank["summary"]
        assert all(torch.isfinite(t).all() for t in rank["weights"].values())
    assert any("is not finite on another rank" in said for said in ranks[0]["skips"] + ranks[1]["skips"])
    assert all(torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]) for name in ranks[0]["weights"])
