"""Confusion matrix, mIoU convention and the evaluator (single process)."""

import math
import pickle

import pytest
import torch

from pointcloud import Evaluator, PointSegNet, SyntheticScenes, confusion_matrix, miou, shard
from pointcloud.metrics import iou_per_class


def test_confusion_matrix_counts_target_rows_and_prediction_columns():
    """conf[t, p] counts points of true class t predicted as p."""
    pred = torch.tensor([[0, 1, 2], [2, 2, 0]])
    target = torch.tensor([[0, 1, 1], [2, 0, 0]])
    assert confusion_matrix(pred, target, 4).tolist() == [[2, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]


def test_confusion_matrix_rejects_out_of_range_and_shape_mismatch():
    """Labels outside [0, C) and mismatched shapes are errors, not silent counts."""
    with pytest.raises(ValueError, match="'target' values must be in"):
        confusion_matrix(torch.tensor([0]), torch.tensor([3]), 3)
    with pytest.raises(ValueError, match="shapes differ"):
        confusion_matrix(torch.tensor([0, 1]), torch.tensor([0]), 3)


def test_miou_exact_on_hand_made_matrix_with_absent_class():
    """mIoU averages over classes present in target or prediction only."""
    conf = torch.tensor([[3, 1, 0], [0, 2, 0], [0, 0, 0]])
    # class 0: 3 / (3 + 0 + 1) = 3/4; class 1: 2 / (2 + 1 + 0) = 2/3; class 2 absent.
    iou = iou_per_class(conf)
    assert iou[0] == pytest.approx(0.75) and iou[1] == pytest.approx(2 / 3)
    assert math.isnan(iou[2])
    assert miou(conf) == pytest.approx((0.75 + 2 / 3) / 2)


def test_miou_counts_a_class_that_is_only_predicted_as_zero():
    """A class never true but predicted has IoU 0 and lowers the mean."""
    conf = confusion_matrix(torch.tensor([0, 0, 2]), torch.tensor([0, 0, 0]), 3)
    assert miou(conf) == pytest.approx((2 / 3 + 0.0) / 2)


def test_miou_perfect_and_empty():
    """A diagonal matrix scores 1; an empty matrix is nan, not 0."""
    assert miou(torch.diag(torch.tensor([5, 0, 7]))) == 1.0
    assert math.isnan(miou(torch.zeros(3, 3, dtype=torch.int64)))


def test_evaluator_matches_a_direct_computation_and_restores_train_mode():
    """The evaluator's metrics equal a hand computation; train mode is restored."""
    torch.manual_seed(0)
    model = PointSegNet(width=16, k=4)
    ds = SyntheticScenes(5, num_points=64, split="val")
    result = Evaluator(ds, batch_size=2)(model)
    assert model.training

    model.eval()
    with torch.no_grad():
        batch = {k: torch.stack([ds[i][k] for i in range(5)]) for k in ("coord", "feat", "segment")}
        out = model(batch)
    conf = confusion_matrix(out["logits"].argmax(-1), batch["segment"], 5)
    assert result["mIoU"] == miou(conf)
    assert result["val_loss"] == pytest.approx(out["loss"].item(), rel=1e-5)


def test_evaluator_keeps_eval_mode_and_pickles():
    """An eval-mode model stays in eval mode; the evaluator pickles by value."""
    model = PointSegNet(width=16, k=0).eval()
    evaluate = Evaluator(shard(SyntheticScenes(3, num_points=64, split="val"), 0, 2), 4)
    evaluate(model)
    assert not model.training
    clone = pickle.loads(pickle.dumps(evaluate))
    assert clone.batch_size == 4 and list(clone.dataset.indices) == [0, 2]
    with pytest.raises(ValueError, match="batch_size"):
        Evaluator(evaluate.dataset, 0)
