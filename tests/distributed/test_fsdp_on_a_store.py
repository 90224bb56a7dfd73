"""A sharded (FSDP2) model saved on 2 gloo ranks to a real S3 API server (moto) resumes bit-identical."""

import pathlib
import sys

import pytest

from _launch import results, run_ranks
from test_fsdp import _equal

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import _s3  # noqa: E402

pytestmark = pytest.mark.distributed


def test_fsdp2_shards_saved_on_s3_resume_bit_identical(tmp_path):
    """Saved at step 5 as DCP shards under last-5-<token> on S3, resumed on 2 ranks: the state saved comes back,
    and the run ends as the uninterrupted one, weights and optimizer state."""
    with _s3.s3_server():
        run_ranks(
            "_fsdp_store_workers:sharded_on_a_store",
            2,
            tmp_path,
            timeout=120,
            tag="store",
            save_dir=f"s3://{_s3.new_bucket()}/run",
            local_dir=str(tmp_path / "whole"),
        ).check()
    zero, one = results(tmp_path, "store", 2)
    step, name, files = zero["checkpoint"]
    assert step == 5 and name.startswith("last-5-") and "COMPLETE" in files and "trainer" in files
    assert one["checkpoint"] == zero["checkpoint"]
    assert _equal(zero["restored"], zero["saved"])  # rank 0 holds the gathered state
    assert _equal(zero["final"], zero["whole"])
