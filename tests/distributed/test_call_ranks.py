"""Two DDP ranks: a Call runs on rank 0 for Scope.MAIN and on every rank for LOCAL and COLLECTIVE, as plan says."""

import pytest

from pimm_fn.core.effects import Scope
from _launch import results, run_ranks

pytestmark = pytest.mark.distributed


def test_a_call_runs_on_the_ranks_its_scope_names_and_each_rank_executes_the_plan(tmp_path):
    """MAIN: rank 0 only; LOCAL: each rank; COLLECTIVE: both ranks in one all-reduce (sum 3); traces are the plan's."""
    save_dir = tmp_path / "run"
    run_ranks("_call_workers:call_on_scopes", 2, tmp_path, save_dir=str(save_dir), tag="calls", timeout=90).check()
    zero, one = results(tmp_path, "calls", 2)
    steps = "3\n6\n"
    assert (save_dir / "calls-main-rank0.txt").read_text() == steps
    assert not (save_dir / "calls-main-rank1.txt").exists()
    for rank in (0, 1):
        assert (save_dir / f"calls-every-rank{rank}.txt").read_text() == steps
        assert (save_dir / f"calls-sum3-rank{rank}.txt").read_text() == steps
    assert len(zero["planned"]) == 6 and zero["executed"] == zero["planned"]
    assert one["executed"] == [e for e in zero["planned"] if e.scope is not Scope.MAIN]
