"""A tiny PointNet-style segmentation network.

Per-point features come from a shared MLP, optionally enriched by one
k-nearest-neighbour max-pool (the cheapest form of local context, as in
PointNet++/DGCNN); a max-pooled global feature is concatenated back to every
point and a per-point head predicts the class.

    >>> import torch
    >>> net = PointSegNet()
    >>> batch = dict(coord=torch.randn(2, 64, 3), feat=torch.randn(2, 64, 7),
    ...              segment=torch.randint(0, 5, (2, 64)))
    >>> out = net(batch)
    >>> out["logits"].shape, out["loss"].ndim
    (torch.Size([2, 64, 5]), 0)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pointcloud.data import FEAT_DIM, NUM_CLASSES

__all__ = ["PointSegNet"]


def _mlp(*widths: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.LayerNorm(b), nn.GELU()]
    return nn.Sequential(*layers)


class PointSegNet(nn.Module):
    """Shared per-point MLP + global max-pool + per-point classifier.

    Args:
        in_dim: per-point input features (``batch["feat"]`` channels).
        num_classes: output classes.
        width: channel width of the point features.
        k: neighbours for the local max-pool; ``0`` gives a plain PointNet.

    ``forward(batch)`` takes ``coord [B, N, 3]``, ``feat [B, N, in_dim]`` and,
    optionally, ``segment [B, N]``; it returns ``dict(logits=[B, N, C])`` plus
    ``loss`` (mean cross-entropy over points) when ``segment`` is present, so a
    training loop can call ``model(batch)["loss"]``. No buffers and no batch
    norm: the output of a sample does not depend on the rest of its batch, and
    DDP has nothing to broadcast in forward.
    """

    def __init__(self, in_dim: int = FEAT_DIM, num_classes: int = NUM_CLASSES, width: int = 64, k: int = 16):
        super().__init__()
        self.k = k
        self.point = _mlp(in_dim, width, width)
        self.local = _mlp(width + 3, width) if k else None
        self.mix = _mlp(width * (2 if k else 1), 2 * width)
        self.head = nn.Sequential(_mlp(4 * width, 2 * width, width), nn.Linear(width, num_classes))

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        coord, feat = batch["coord"], batch["feat"]
        x = self.point(feat)  # [B, N, W]
        if self.local is not None:
            x = torch.cat([x, self._local(coord, x)], -1)  # [B, N, 2W]
        x = self.mix(x)  # [B, N, 2W]
        g = x.max(dim=1, keepdim=True).values.expand_as(x)  # global
        logits = self.head(torch.cat([x, g], -1))  # [B, N, C]
        out = {"logits": logits}
        if "segment" in batch:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), batch["segment"].flatten())
        return out

    def _local(self, coord: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # Max over each point's k nearest neighbours of (feature, offset).
        k = min(self.k, coord.shape[1])
        idx = torch.cdist(coord, coord).topk(k, dim=-1, largest=False).indices  # [B,N,k]
        b = torch.arange(coord.shape[0], device=coord.device)[:, None, None]
        rel = coord[b, idx] - coord[:, :, None]  # [B, N, k, 3]
        return self.local(torch.cat([x[b, idx], rel], -1)).max(dim=2).values
