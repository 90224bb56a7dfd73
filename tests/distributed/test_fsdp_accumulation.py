"""FSDP2 with gradient accumulation: trains as DDP on the whole batch does, and resumes bit for bit."""

import pytest
import torch

from _launch import results, run_ranks
from test_fsdp import _equal

pytestmark = pytest.mark.distributed


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)


def test_fsdp2_accumulating_two_micro_batches_trains_as_ddp_on_both_and_resumes_exactly(tmp_path):
    """2 gloo ranks, TrainStep(accumulate=2): weights as DDP on batches of 8; stopped at 4 and resumed, bit-identical."""
    run_ranks(
        "_fsdp_accumulate_workers:accumulate", 2, tmp_path, save_dir=str(tmp_path / "run"), tag="acc", timeout=150
    ).check()
    zero = results(tmp_path, "acc", 2)[0]  # rank 0 holds the gathered states
    assert zero["steps"] == 6 and zero["resumed_at"] == 4
    assert _close(zero["whole"]["weights"], zero["reference"]["weights"])
    assert not _equal(zero["whole"]["weights"], zero["stopped"]["weights"])  # the last 2 steps trained
    assert _equal(zero["restored"], zero["stopped"])
    assert _equal(zero["resumed"], zero["whole"])
