"""Real 2-rank gloo runs killed with SIGKILL, then resumed: nothing lost, nothing different."""

import signal

import pytest
import torch

from _launch import results, run_ranks
from pimm_fn.checkpoint import latest_checkpoint

pytestmark = pytest.mark.distributed


def _assert_bit_identical(a: dict, b: dict):
    assert list(a) == list(b)
    for name in a:
        assert torch.equal(a[name], b[name]), f"weights {name!r} differ"


def _after(trace, step):
    return [entry for entry in trace if entry.step > step]


@pytest.mark.parametrize(("killed_after", "saved_at"), [(10, 8), (14, 12)], ids=["mid-epoch", "epoch-end"])
def test_sigkill_then_resume_ends_bit_identical(reference, tmp_path, killed_after, saved_at):
    """A run whose rank 0 is SIGKILLed resumes from its last save and ends bit-identical, trace included.

    Step 8 is mid-epoch (6 steps per epoch); the save of step 12 is the deferred one at the end of epoch 1.
    """
    save_dir = str(tmp_path / "run")
    killed = run_ranks(
        "train", 2, tmp_path, save_dir=save_dir, tag="killed", kill_after=killed_after, kill_rank=0, grace=2
    )
    assert killed.codes[0] == -signal.SIGKILL, killed.report()
    assert f"kills itself after step {killed_after}" in killed.log(0)
    assert latest_checkpoint(tmp_path / "run" / "model").step == saved_at

    run_ranks("train", 2, tmp_path, save_dir=save_dir, tag="resumed", resume="auto").check()
    resumed = results(tmp_path, "resumed", 2)
    for rank in range(2):
        assert resumed[rank]["restored"]["progress"].global_step == saved_at
        _assert_bit_identical(resumed[rank]["final"]["weights"], reference[rank]["final"]["weights"])
        assert resumed[rank]["final"]["best"] == reference[rank]["final"]["best"]
        # Every effect from the resume point on, with each step's (bit-identical) losses in its event.
        assert resumed[rank]["trace"] == _after(reference[rank]["trace"], saved_at)


def test_rank_killed_inside_collective_save_leaves_previous_checkpoint(reference, tmp_path):
    """Rank 1 SIGKILLed inside the DCP write of step 12: the partial save is never discovered, resume uses step 8."""
    save_dir = str(tmp_path / "run")
    model_dir = tmp_path / "run" / "model"
    died = run_ranks("train", 2, tmp_path, save_dir=save_dir, tag="died", die_in_save=[12, 1], grace=2)
    assert died.codes[1] == -signal.SIGKILL, died.report()
    assert "dies inside the DCP write of step 12" in died.log(1)
    partial = sorted(p.name for p in model_dir.glob(".staging-*"))
    assert partial == [".staging-last-12"], sorted(p.name for p in model_dir.iterdir())
    assert any((model_dir / partial[0] / "trainer").iterdir()), "the killed save wrote nothing: not mid-way"
    assert latest_checkpoint(model_dir).step == 8

    run_ranks("train", 2, tmp_path, save_dir=save_dir, tag="resumed", resume="auto").check()
    resumed = results(tmp_path, "resumed", 2)
    assert [r["restored"]["progress"].global_step for r in resumed] == [8, 8]
    for rank in range(2):
        _assert_bit_identical(resumed[rank]["final"]["weights"], reference[rank]["final"]["weights"])
    assert not list(model_dir.glob(".staging-*")), "the next save did not clear the partial one"
    assert latest_checkpoint(model_dir).step == 18
