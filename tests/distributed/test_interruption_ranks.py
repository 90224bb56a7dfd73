"""Across ranks, a step that raises alike everywhere continues exactly; one that raises on one rank stops all, fast."""

import pytest
import torch

from _launch import results, run_ranks

pytestmark = pytest.mark.distributed


def assert_same(found, expected):
    """The weights, optimizer state and trace of ``found`` equal ``expected``'s, bit for bit."""
    assert found["weights"].keys() == expected["weights"].keys()
    for key, value in expected["weights"].items():
        assert torch.equal(found["weights"][key], value), key
    ours, theirs = found["optimizer"], expected["optimizer"]
    assert ours["param_groups"] == theirs["param_groups"]
    for index, state in theirs["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["state"][index][key], value), (index, key)
    assert (found["progress"], found["best"], found["metrics"]) == (
        expected["progress"],
        expected["best"],
        expected["metrics"],
    )
    assert found["trace"] == expected["trace"]


def test_a_failure_alike_on_every_rank_continues_exactly(tmp_path):
    """A hook (step 5), evaluator (step 8), forward (step 6) or save (step 4) raising on both ranks, then run():
    the uninterrupted run's end, bit for bit."""
    run_ranks("interrupt_alike", 2, tmp_path, timeout=90, save_dir=str(tmp_path / "run"), tag="alike").check()
    for rank in results(tmp_path, "alike", 2):
        assert rank["hook"]["error"]["message"].startswith(f"injected hook failure at step 5 on rank {rank['rank']}")
        assert rank["hook"]["interrupted"].phase == "hook raise_at(5)"
        assert rank["effect"]["interrupted"].phase == "effect Evaluate(evaluator='val', step=8, broadcast=True)"
        assert rank["forward"]["interrupted"].phase == "the train step"
        assert rank["save"]["interrupted"].phase.startswith("effect SaveCheckpoint(step=4")
        for kind in ("hook", "effect", "forward", "save"):
            assert rank[kind]["interrupted"].continues
            assert_same(rank[kind], rank["ref"])


@pytest.mark.parametrize("where", ["effect", "hook"])
def test_a_failure_on_one_rank_stops_every_rank_within_seconds(tmp_path, where):
    """Rank 1's evaluator (or hook) raises: rank 1 re-raises it, rank 0 raises PeerFailureError naming it; no hang."""
    ranks = run_ranks(
        "interrupt_one_rank", 2, tmp_path, timeout=45, save_dir=str(tmp_path / "run"), tag=where, where=where
    ).check()
    assert ranks.seconds < 30
    zero, one = results(tmp_path, where, 2)
    injected = (
        "injected evaluator failure at call 2 on rank 1"
        if where == "effect"
        else ("injected hook failure at step 5 on rank 1")
    )
    assert one["error"]["type"] == "ValueError" and one["error"]["message"].startswith(injected)
    assert "rank(s) 0 did not fail here" in one["error"]["message"] and 'resume="auto"' in one["error"]["message"]
    assert zero["error"]["type"] == "PeerFailureError"
    assert zero["error"]["message"].startswith("rank 1 failed at step") and injected in zero["error"]["message"]
    assert "so rank 0 stopped too" in zero["error"]["message"]
    for rank in (zero, one):
        assert rank["seconds"] < 20
        assert not rank["interrupted"].continues
        assert rank["again"]["type"] == "RuntimeError" and "cannot continue this run" in rank["again"]["message"]
