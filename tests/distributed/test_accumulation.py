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
