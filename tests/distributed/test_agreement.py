"""Every rank runs the same collective effects, and the guard catches a hook that breaks this."""

import json

import pytest

import pimm_fn as pf
from _launch import results, run_ranks
from _workers import MAX_EPOCHS, hooks_for
from pimm_fn.core.effects import Scope, WriteBest

pytestmark = pytest.mark.distributed
ITERS_PER_EPOCH = 6  # 48 samples, 2 ranks, batch 4


def collective(trace) -> list:
    """The collective part of a trace, comparable with a plan's (events without their rank-local outputs)."""
    return [(e.step, type(e.event).__name__, e.hook, e.effect) for e in trace if e.effect.scope is Scope.COLLECTIVE]


def test_collective_traces_agree_across_ranks_and_equal_the_plan(reference):
    """The collective effects both ranks executed are the same, in order, and are what pf.plan predicts."""
    planned = pf.plan(hooks_for("standard"), iters_per_epoch=ITERS_PER_EPOCH, max_epochs=MAX_EPOCHS)
    assert collective(reference[0]["trace"]) == collective(reference[1]["trace"]) == collective(planned)
    assert [e.step for e in planned if type(e.effect).__name__ == "SaveCheckpoint"] == [4, 8, 12, 16, 18]
    # Only the main rank executes main-rank effects (best writes, logs).
    assert all(e.effect.scope is not Scope.MAIN for e in reference[1]["trace"])
    assert any(e.effect.scope is Scope.MAIN for e in reference[0]["trace"])


def test_metric_on_rank0_only_never_changes_the_collective_saves(tmp_path):
    """With broadcast=False and no result on rank 1, both ranks still save together; rank 0 writes model_best.

    A correct hook of the user's own also saves (every 5 steps): the guard watches and passes it.
    """
    scores = {"0": [0.1, 0.5, 0.3, 0.7, 0.2, 0.9]}  # evaluations at steps 3, 6, 9, 12, 15, 18
    run_ranks(
        "train",
        2,
        tmp_path,
        save_dir=str(tmp_path / "run"),
        tag="r0",
        hooks="rank0_scores",
        scores=scores,
        check_agreement=True,
        hash_seeds=True,  # rank-local metrics, and sets of strings iterating apart: still the same saves
    ).check()
    ranks = results(tmp_path, "r0", 2)
    planned = pf.plan(hooks_for("rank0_scores", scores), iters_per_epoch=ITERS_PER_EPOCH, max_epochs=MAX_EPOCHS)
    assert collective(ranks[0]["trace"]) == collective(ranks[1]["trace"]) == collective(planned)
    saves = [e.effect.step for e in ranks[1]["trace"] if type(e.effect).__name__ == "SaveCheckpoint"]
    assert saves == [4, 5, 8, 10, 12, 15, 16, 18]
    assert [e.effect.step for e in ranks[0]["trace"] if isinstance(e.effect, WriteBest)] == [3, 6, 12, 18]
    assert not [e for e in ranks[1]["trace"] if isinstance(e.effect, WriteBest)]
    assert ranks[0]["final"]["best"] == {"score": 0.9} and ranks[1]["final"]["best"] == {}
    model_dir = tmp_path / "run" / "model"
    assert (model_dir / "model_best.pth").is_file()
    assert json.loads((model_dir / "model_best.json").read_text()) == {"metric": "score", "value": 0.9, "step": 18}


def test_guard_names_a_hook_that_saves_from_rank_local_metrics(tmp_path):
    """Every rank raises CollectiveDivergenceError naming the event, step, hook and wishes, in seconds."""
    scores = {"0": [0.1, 0.5, 0.3]}  # rank 0 improves at step 3; rank 1 computes nothing
    ranks = run_ranks(
        "train", 2, tmp_path, timeout=30, save_dir=str(tmp_path / "run"), tag="broken", hooks="broken", scores=scores
    ).check()
    assert ranks.seconds < 20
    found = results(tmp_path, "broken", 2)
    messages = []
    for rank in found:
        kind, message = rank["error"]
        assert kind == "CollectiveDivergenceError"
        messages.append(message)
    assert messages[0] == messages[1]
    message = messages[0]
    assert "MetricsPublished at global step 3" in message
    assert "#1 save_on_local_improvement('score')" in message
    assert "rank 0 wanted: SaveCheckpoint(step=3, snapshot=False" in message
    assert "rank 1 wanted: nothing" in message
    # Nothing collective ran after the divergence: no checkpoint of step 3 exists.
    assert not (tmp_path / "run" / "model" / "last").exists()


def test_guard_raises_at_once_when_every_rank_wants_something_different(tmp_path):
    """Ranks that all have collective effects, differing, raise at that very event, before any save runs."""
    run_ranks("train", 2, tmp_path, timeout=30, save_dir=str(tmp_path / "run"), tag="both", hooks="broken_both").check()
    for rank in results(tmp_path, "both", 2):
        kind, message = rank["error"]
        assert kind == "CollectiveDivergenceError"
        assert "AfterStep at global step 2" in message and "#1 snapshot_on_rank1()" in message
        assert "rank 0 wanted: SaveCheckpoint(step=2, snapshot=False" in message
        assert "rank 1 wanted: SaveCheckpoint(step=2, snapshot=True" in message
        assert rank["final"]["progress"].global_step == 1  # the error came before step 2's state was kept
    assert not (tmp_path / "run" / "model").exists()


def test_guard_catches_different_hook_lists_before_training(tmp_path):
    """A rank that built another hook list is reported at BeforeTrain, before any step trains."""
    run_ranks(
        "train", 2, tmp_path, timeout=30, save_dir=str(tmp_path / "run"), tag="lists", hooks="rank1_extra"
    ).check()
    for rank in results(tmp_path, "lists", 2):
        kind, message = rank["error"]
        assert kind == "CollectiveDivergenceError"
        assert "hook #1: rank 0: (no hook); rank 1: log_every(7)" in message
        assert "hook #0" not in message  # save_every(4) is the same on both ranks
        assert rank["final"]["progress"].global_step == 0


def test_guard_names_every_hook_configured_from_the_rank_before_training(tmp_path):
    """save_every(2) vs (3), evaluate_every(4, ...) vs (5, ...), async save on rank 0 only: every rank raises
    before step 1, naming each hook by position and identity with each rank's value, and saying how to fix it."""
    ranks = run_ranks(
        "train", 2, tmp_path, timeout=30, save_dir=str(tmp_path / "run"), tag="config", hooks="rank_config"
    ).check()
    found = results(tmp_path, "config", 2)
    messages = []
    for rank in found:
        kind, message = rank["error"]
        assert kind == "CollectiveDivergenceError"
        assert rank["final"]["progress"].global_step == 0 and rank["trace"] == []
        messages.append(message)
    assert messages[0] == messages[1]
    lines = messages[0].splitlines()
    assert "hook #0: rank 0: save_every(2); rank 1: save_every(3)" in lines[1]
    assert (
        "hook #1: rank 0: evaluate_every(4, ValLoss, name='val'); rank 1: evaluate_every(5, ValLoss, name='val')"
    ) in lines[2]
    assert "hook #2: rank 0: save_every(5, async_save=True); rank 1: save_every(5)" in lines[3]
    assert "hook #3" not in messages[0] and "iters_per_epoch" not in messages[0]
    assert "Every rank must build the same hook list, with the same arguments" in messages[0]
    for r in range(2):  # each rank's own log says it too
        assert "CollectiveDivergenceError: ranks would start training with different hooks" in ranks.log(r)
        assert "rank 0: save_every(2); rank 1: save_every(3)" in ranks.log(r)
    assert not (tmp_path / "run" / "model").exists()


def test_guard_compares_the_setup_of_a_resumed_run(tmp_path):
    """Resuming a checkpoint with a named chain whose leaves differ per rank raises on every rank at BeforeTrain."""
    run_ranks("resume_differently", 2, tmp_path, timeout=30, save_dir=str(tmp_path / "run"), tag="resumed").check()
    for rank in results(tmp_path, "resumed", 2):
        kind, message = rank["error"]
        assert kind == "CollectiveDivergenceError"
        assert (
            "hook #1: rank 0: extras (leaves: log_every(5), save_every(6)); "
            "rank 1: extras (leaves: log_every(5), save_every(7))"
        ) in message
