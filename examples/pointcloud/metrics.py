"""Segmentation metrics and a sharded, distributed-aware evaluator.

>>> import torch
>>> conf = confusion_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]), 3)
>>> conf.tolist()
[[1, 1, 0], [0, 1, 0], [0, 0, 0]]
>>> round(miou(conf), 4)   # class 2 is absent from both: not averaged
0.5
"""

from __future__ import annotations

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from pointcloud.data import NUM_CLASSES, collate

__all__ = ["confusion_matrix", "iou_per_class", "miou", "Evaluator"]


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Count ``conf[t, p]``: points of true class ``t`` predicted as ``p``.

    Args:
        pred, target: integer tensors of the same shape, values in
            ``[0, num_classes)``.
        num_classes: size of the square matrix.

    Returns:
        An int64 ``[num_classes, num_classes]`` tensor (rows: target).

    Raises:
        ValueError: if shapes differ or a value is out of range.
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred and target shapes differ: {tuple(pred.shape)} vs {tuple(target.shape)}")
    pred, target = pred.reshape(-1).long(), target.reshape(-1).long()
    for name, t in (("pred", pred), ("target", target)):
        if t.numel() and (t.min() < 0 or t.max() >= num_classes):
            raise ValueError(f"'{name}' values must be in [0, {num_classes}) (got [{int(t.min())}, {int(t.max())}])")
    flat = target * num_classes + pred
    return torch.bincount(flat, minlength=num_classes**2).reshape(num_classes, num_classes)


def iou_per_class(conf: torch.Tensor) -> torch.Tensor:
    """Per-class IoU ``tp / (tp + fp + fn)``; NaN where a class is absent.

    A class is *absent* when it appears neither in the target nor in the
    prediction (its row and column are all zero), so its IoU is undefined.
    """
    conf = conf.double()
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp
    return torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))


def miou(conf: torch.Tensor) -> float:
    """Mean IoU over the classes present in the target or the prediction.

    Convention: a class absent from both contributes nothing (it is neither
    a 0 nor a 1); a class only predicted, never true, has IoU 0 and counts.
    An all-zero matrix gives ``nan``.

    >>> import torch
    >>> miou(torch.tensor([[2, 0], [0, 0]]))           # only class 0 present
    1.0
    >>> miou(torch.tensor([[1, 1], [0, 0]]))           # class 1 predicted, never true
    0.25
    """
    iou = iou_per_class(conf)
    present = ~iou.isnan()
    return float(iou[present].mean()) if present.any() else float("nan")


@attrs.frozen(eq=False)
class Evaluator:
    """Evaluate a segmentation model on this rank's validation shard.

    The pattern for sharded evaluation: every rank evaluates a *disjoint*
    shard (see :func:`~pointcloud.data.shard`) and accumulates additive
    statistics (the confusion matrix, the summed loss and the point count);
    when ``torch.distributed`` is initialized, these are all-reduced with
    ``SUM`` so every rank returns the metrics of the **whole** validation set,
    identical on every rank. (Averaging per-rank mIoUs would be wrong: IoU is
    not additive.) The number of collectives does not depend on the shard
    size, so uneven shards cannot hang.

    It is a frozen, module-level attrs class, hence picklable for spawned
    processes; ``evaluator(model)`` returns ``{"mIoU": float, "val_loss":
    float}``. The model is run in eval mode under ``torch.no_grad`` and put
    back in its previous mode. A DDP wrapper is bypassed (``model.module``) so
    evaluation forward passes issue no DDP collectives.

    Args:
        dataset: this rank's validation shard.
        batch_size: evaluation batch size.
        num_classes: number of classes.

    Example:
        >>> from pointcloud import PointSegNet, SyntheticScenes, shard
        >>> evaluate = Evaluator(shard(SyntheticScenes(4, num_points=64, split="val")), 2)
        >>> sorted(evaluate(PointSegNet()))
        ['mIoU', 'val_loss']
    """

    dataset: Dataset
    batch_size: int = attrs.field(default=16, validator=attrs.validators.gt(0))
    num_classes: int = attrs.field(default=NUM_CLASSES, validator=attrs.validators.gt(0))

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        net = getattr(model, "module", model)
        was_training = net.training
        device = next(net.parameters()).device
        conf = torch.zeros(self.num_classes, self.num_classes, dtype=torch.int64, device=device)
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, points
        net.eval()
        try:
            with torch.no_grad():
                for batch in DataLoader(self.dataset, self.batch_size, collate_fn=collate):
                    batch = {k: v.to(device) for k, v in batch.items()}
                    logits = net(batch)["logits"].flatten(0, 1)
                    target = batch["segment"].flatten()
                    conf += confusion_matrix(logits.argmax(-1), target, self.num_classes)
                    sums[0] += F.cross_entropy(logits, target, reduction="sum").double()
                    sums[1] += target.numel()
        finally:
            net.train(was_training)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(conf, op=dist.ReduceOp.SUM)
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        loss = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
        return {"mIoU": miou(conf.cpu()), "val_loss": loss}
