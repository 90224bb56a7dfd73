"""Two gloo ranks checkpointing to a real S3 API server (moto, on loopback): a rank killed mid-save, then resume.

Both ranks are SIGKILLed inside the DCP write of step 12, their files written
(a rank that survives a peer's death removes the failed save itself): the
half-written ``last-12-*`` has no ``COMPLETE`` and is invisible, step 8 stays
the latest; a resume from it on 2 ranks ends bit-identical to the
uninterrupted local run, and its first publish deletes the leftover.
"""

import pathlib
import signal
import sys

import pytest
import torch

from pimm_fn.checkpoint import latest_checkpoint
from pimm_fn.checkpoint import storage

from _launch import results, run_ranks

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import _s3  # noqa: E402


@pytest.fixture(scope="module")
def s3_endpoint():
    with _s3.s3_server() as endpoint:
        yield endpoint


def test_rank_killed_mid_save_on_s3_then_resume_is_bit_identical(reference, s3_endpoint, tmp_path):
    save_dir = f"s3://{_s3.new_bucket()}/run"
    model = storage.location(save_dir) / "model"
    died = run_ranks(
        "_store_workers:train_dying",
        2,
        tmp_path,
        save_dir=save_dir,
        tag="died",
        step=12,
        victims=[0, 1],
        grace=2,
        timeout=120,
    )
    assert died.codes == (-signal.SIGKILL, -signal.SIGKILL), died.report()
    half = [p for p in model.iterdir() if p.name.startswith("last-12-")]
    assert len(half) == 1 and (half[0] / "trainer").is_dir() and not (half[0] / "COMPLETE").exists()
    assert latest_checkpoint(model).step == 8

    run_ranks("train", 2, tmp_path, save_dir=save_dir, tag="resumed", resume="auto", timeout=120).check()
    resumed = results(tmp_path, "resumed", 2)
    for rank in range(2):
        assert resumed[rank]["restored"]["progress"].global_step == 8
        mine, ref = resumed[rank]["final"]["weights"], reference[rank]["final"]["weights"]
        assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in mine)
        assert resumed[rank]["final"]["best"] == reference[rank]["final"]["best"]
    assert not (half[0] / "COMPLETE").exists() and not half[0].exists()
    assert "model_best.pth" in [p.name for p in model.iterdir()]
