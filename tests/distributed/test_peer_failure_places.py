"""Ranks failing at the same effect are alike even when its repr holds each rank's own values (a Log record)."""

import pytest
import torch

from _launch import results, run_ranks

pytestmark = pytest.mark.distributed


def test_a_log_handler_failing_alike_on_every_rank_lets_run_continue_on_both(tmp_path):
    """A Log handler raising at step 4 on both ranks (each record holding its rank's own losses): run() continues
    on both, and the run ends as the uninterrupted one, weights, trace and history."""
    run_ranks(
        "_peer_workers:log_fails_alike", 2, tmp_path, timeout=90, save_dir=str(tmp_path / "run"), tag="log"
    ).check()
    for rank in results(tmp_path, "log", 2):
        assert rank["error"]["message"].startswith("injected Log handler failure at step 4")
        assert rank["interrupted"].continues and rank["interrupted"].phase.startswith("effect Log(step=4, kind=")
        found, expected = rank["failing"], rank["ref"]
        for key, value in expected["weights"].items():
            assert torch.equal(found["weights"][key], value), key
        assert (found["progress"], found["trace"]) == (expected["progress"], expected["trace"])
        assert found["history"] == expected["history"]
