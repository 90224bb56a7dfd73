"""A DataLoader evaluated on 1 and 2 gloo ranks: every sample counted once, equal to a reference computed by hand."""

import pytest
import torch
import torch.distributed as td

from _eval_workers import N, classifier, data, evaluate
from _launch import free_port, results, run_ranks

pytestmark = pytest.mark.distributed


def _by_hand(weights=None) -> int:
    """The classifier's right answers over the whole dataset, in one pass."""
    model = classifier()
    if weights is not None:
        model.load_state_dict(weights)
    x, y, _ = data().tensors
    with torch.no_grad():
        return int((model(x).argmax(-1) == y).sum())


def _check(ranks) -> None:
    correct = _by_hand()
    for r in ranks:
        assert r["totals"] == {"val/correct": correct, "val/count": N, "val/index_sum": N * (N - 1) / 2}
        assert r["sharded"] == pytest.approx(r["totals"])  # an FSDP2 model: as many forwards on each rank
        assert r["mean"] == pytest.approx({"val/correct": correct / N, "val/index_sum": (N - 1) / 2})
        assert r["torchmetrics"] == pytest.approx({"tm/acc": correct / N})
        best = _by_hand(r["best weights"]) / N
        assert r["best"] == {"val/correct": pytest.approx(best)} and r["test best"]["val/correct"] == pytest.approx(
            best
        )
        assert r["test final"]["val/correct"] == pytest.approx(_by_hand(r["final weights"]) / N)
        assert r["typo"] == (
            "best_on('val/corect') waits for metric 'val/corect', but the evaluators publish "
            "['val/correct', 'val/index_sum']: did you mean 'val/correct'?"
        )
        bare = (
            "best_on('correct') waits for metric 'correct', but the evaluators publish ['val/correct', "
            "'val/index_sum']: did you mean 'val/correct'? (a loader_evaluator puts its name before each metric "
            "it publishes)"
        )
        assert r["bare"] == {None: (bare, None), 0: (bare, 2)}  # every rank alike: in loop(), or at step 2


def test_on_two_ranks_uneven_shards_count_each_sample_once_and_agree_with_the_reference(tmp_path):
    """11 samples as shards of 6 and 5 (no padded repeat): sums (also of an FSDP2 model), torchmetrics, best_on,
    test, the typo and a bare metric name alike (refused on every rank, no rank left waiting), and ranks built with
    other evaluators told so, on every rank, before the sanity check evaluates."""
    run_ranks("_eval_workers:evaluate", 2, tmp_path, save_dir=str(tmp_path / "run"), tag="eval", timeout=120).check()
    _check(results(tmp_path, "eval", 2))
    for rank in results(tmp_path, "eval", 2):  # one rank built with an evaluator, one without: no rank left waiting
        assert rank["diverged"] == (
            "ranks would run other evaluators in the sanity check before the first step "
            "(rank 0: ['val']; rank 1: []): every rank must build the same hook list, with "
            "the same arguments, in the same order"
        )


def test_on_a_one_rank_gloo_group_the_evaluator_agrees_with_the_reference(tmp_path):
    """The same worker in this process, inside a real one-rank gloo group."""
    port = free_port()
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        evaluate(0, 1, tmp_path, save_dir=str(tmp_path / "run"), tag="eval")
    finally:
        td.destroy_process_group()
    _check(results(tmp_path, "eval", 1))
