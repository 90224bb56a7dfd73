"""Two DDP ranks with the agreement guard on: still no tensor read on a quiet step."""

import pytest

from _launch import results, run_ranks
from _sync_workers import HOOKS_CADENCES

pytestmark = pytest.mark.distributed


def test_ddp_ranks_read_no_tensor_on_quiet_steps(tmp_path):
    run_ranks("_sync_workers:count_reads", 2, tmp_path, save_dir=str(tmp_path / "run"), tag="reads", timeout=90).check()
    for rank in results(tmp_path, "reads", 2):
        ipe, reads = rank["iters_per_epoch"], rank["reads"]
        quiet = [k for k in reads if all(k % c for c in HOOKS_CADENCES) and k % ipe not in (0, 1)]
        assert quiet and {k: reads[k] for k in quiet} == dict.fromkeys(quiet, [])
        assert reads[10]  # log_every reads there: the count sees reads
