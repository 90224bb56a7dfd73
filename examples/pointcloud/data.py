"""Procedurally generated point-cloud scenes for semantic segmentation.

Every scene is a pure function of ``(seed, split, index)``: a ground plane with
a few boxes, spheres, cylinders and thin poles standing on it, sampled on
their surfaces, jittered, rotated about ``z`` and scaled. Nothing is
downloaded and no global random state is touched, so two processes (or a
resumed run) see exactly the same samples.

    >>> ds = SyntheticScenes(4, num_points=256, seed=0)
    >>> s = ds[1]
    >>> s["coord"].shape, s["feat"].shape, s["segment"].shape
    (torch.Size([256, 3]), torch.Size([256, 7]), torch.Size([256]))
    >>> bool((ds[1]["coord"] == s["coord"]).all())
    True
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

CLASSES = ("ground", "box", "sphere", "cylinder", "pole")
NUM_CLASSES = len(CLASSES)
FEAT_DIM = 7  # xyz, height above ground, noisy surface normal
_SPLITS = {"train": 0, "val": 1, "test": 2}

__all__ = [
    "CLASSES",
    "NUM_CLASSES",
    "FEAT_DIM",
    "SyntheticScenes",
    "collate",
    "make_loaders",
    "shard",
]


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True).clip(1e-9)


def _ground(rng, n, half):
    pts = np.column_stack([rng.uniform(-half, half, (n, 2)), np.zeros(n)])
    return pts, np.tile([0.0, 0.0, 1.0], (n, 1))


def _box(rng, n, size):
    # Five faces (no bottom), each sampled in proportion to its area.
    sx, sy, sz = size
    areas = np.array([sx * sy, sy * sz, sy * sz, sx * sz, sx * sz])
    face = rng.choice(5, size=n, p=areas / areas.sum())
    u = rng.uniform(-0.5, 0.5, (n, 3)) * size
    u[:, 2] += sz / 2
    normal = np.zeros((n, 3))
    top, px, nx, py, ny = (face == k for k in range(5))
    u[top, 2], normal[top, 2] = sz, 1.0
    u[px, 0], normal[px, 0] = sx / 2, 1.0
    u[nx, 0], normal[nx, 0] = -sx / 2, -1.0
    u[py, 1], normal[py, 1] = sy / 2, 1.0
    u[ny, 1], normal[ny, 1] = -sy / 2, -1.0
    return u, normal


def _sphere(rng, n, r):
    normal = _unit(rng.normal(size=(n, 3)))
    return normal * r + [0.0, 0.0, r], normal


def _cylinder(rng, n, r, h):
    # Side and top cap in proportion to their areas.
    cap = rng.uniform(size=n) < (r / (r + 2 * h))
    theta = rng.uniform(0, 2 * np.pi, n)
    rad = np.where(cap, r * np.sqrt(rng.uniform(size=n)), r)
    pts = np.column_stack([rad * np.cos(theta), rad * np.sin(theta), np.where(cap, h, rng.uniform(0, h, n))])
    normal = np.column_stack([np.cos(theta), np.sin(theta), np.zeros(n)])
    normal[cap] = [0.0, 0.0, 1.0]
    return pts, normal


def _rot_z(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


class SyntheticScenes(Dataset):
    """A deterministic dataset of synthetic segmentation scenes.

    Sample ``i`` depends only on ``(seed, split, i)``, so the dataset is
    stateless, picklable and identical in every process. Classes are
    :data:`CLASSES` (ground, box, sphere, cylinder, pole).

    Args:
        length: number of scenes.
        num_points: points per scene (all scenes have exactly this many).
        seed: base seed.
        split: ``"train"``, ``"val"`` or ``"test"``; splits with the same
            seed are disjoint streams of scenes.
        jitter: standard deviation of the positional noise.

    Returns (per item):
        ``dict(coord=float32 [N, 3], feat=float32 [N, 7], segment=int64 [N])``
        where ``feat`` is ``(x, y, z, height, nx, ny, nz)`` with a noisy
        surface normal (as an estimated normal would be).
    """

    def __init__(
        self, length: int, *, num_points: int = 512, seed: int = 0, split: str = "train", jitter: float = 0.01
    ):
        if length < 0:
            raise ValueError(f"'length' must be >= 0 (got {length})")
        if num_points < 64:
            raise ValueError(f"'num_points' must be >= 64 (got {num_points})")
        if split not in _SPLITS:
            raise ValueError(f"'split' must be one of {sorted(_SPLITS)} (got {split!r})")
        self.length, self.num_points, self.seed = length, num_points, seed
        self.split, self.jitter = split, jitter

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"SyntheticScenes({self.length}, num_points={self.num_points}, seed={self.seed}, split={self.split!r})"

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self!r}")
        rng = np.random.default_rng([self.seed, _SPLITS[self.split], index])
        coord, normal, label = self._scene(rng)
        return {
            "coord": torch.from_numpy(coord.astype(np.float32)),
            "feat": torch.from_numpy(np.concatenate([coord, coord[:, 2:], normal], 1).astype(np.float32)),
            "segment": torch.from_numpy(label.astype(np.int64)),
        }

    def _scene(self, rng):
        half = 1.0
        parts = []  # (points, normals, class) in object frame, already placed
        n_obj = rng.integers(3, 7)
        kinds = rng.choice([1, 2, 3, 4], size=n_obj)
        kinds[: min(4, n_obj)] = rng.permutation([1, 2, 3, 4])[: min(4, n_obj)]
        centers = self._place(rng, n_obj, half)
        objs = []
        for kind, center in zip(kinds, centers):
            if kind == 1:
                size = rng.uniform([0.2, 0.2, 0.15], [0.5, 0.5, 0.5])
                area = size[0] * size[1] + 2 * size[2] * (size[0] + size[1])
                objs.append((kind, center, area, ("box", size)))
            elif kind == 2:
                r = rng.uniform(0.12, 0.25)
                objs.append((kind, center, 4 * np.pi * r * r, ("sphere", r)))
            elif kind == 3:
                r, h = rng.uniform(0.1, 0.2), rng.uniform(0.25, 0.6)
                objs.append((kind, center, 2 * np.pi * r * (r / 2 + h), ("cyl", r, h)))
            else:
                r, h = rng.uniform(0.015, 0.03), rng.uniform(0.8, 1.3)
                # Poles are thin: give them a fixed share so they stay visible.
                objs.append((kind, center, 0.12, ("cyl", r, h)))
        # Ground gets a fixed share; objects share the rest by surface area.
        weights = np.array([1.2] + [o[2] for o in objs])
        counts = rng.multinomial(self.num_points, weights / weights.sum())
        pts, nrm = _ground(rng, counts[0], half)
        parts.append((pts, nrm, 0))
        for (kind, center, _, spec), n in zip(objs, counts[1:]):
            if spec[0] == "box":
                p, q = _box(rng, n, spec[1])
            elif spec[0] == "sphere":
                p, q = _sphere(rng, n, spec[1])
            else:
                p, q = _cylinder(rng, n, spec[1], spec[2])
            rot = _rot_z(rng.uniform(0, 2 * np.pi))
            parts.append((p @ rot.T + [center[0], center[1], 0.0], q @ rot.T, kind))
        coord = np.concatenate([p for p, _, _ in parts])
        normal = np.concatenate([q for _, q, _ in parts])
        label = np.concatenate([np.full(len(p), k) for p, _, k in parts])
        # Scene-level augmentation: rotation about z, scaling, jitter.
        rot = _rot_z(rng.uniform(0, 2 * np.pi))
        scale = rng.uniform(0.8, 1.2)
        coord = coord @ rot.T * scale + rng.normal(0, self.jitter, coord.shape)
        normal = _unit(normal @ rot.T + rng.normal(0, 0.1, normal.shape))
        perm = rng.permutation(len(coord))
        return coord[perm], normal[perm], label[perm]

    @staticmethod
    def _place(rng, n, half):
        # Rejection-sample centres at least 0.45 apart so objects do not overlap.
        centers: list[np.ndarray] = []
        while len(centers) < n:
            c = rng.uniform(-half + 0.25, half - 0.25, 2)
            if all(np.linalg.norm(c - o) > 0.45 for o in centers) or rng.uniform() < 0.02:
                centers.append(c)
        return centers


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack equally sized samples into ``[B, N, ...]`` batch tensors.

    >>> b = collate([SyntheticScenes(2, num_points=64)[i] for i in range(2)])
    >>> b["coord"].shape, b["segment"].dtype
    (torch.Size([2, 64, 3]), torch.int64)
    """
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def shard(dataset: Dataset, rank: int = 0, world_size: int = 1) -> Subset:
    """This rank's strided shard: indices ``rank, rank + world_size, ...``.

    The shards of all ranks are disjoint and together cover every index
    exactly once (shard sizes differ by at most one).

    >>> [list(shard(range(5), r, 2).indices) for r in range(2)]
    [[0, 2, 4], [1, 3]]
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"'rank' must be in [0, {world_size}) (got {rank})")
    return Subset(dataset, range(rank, len(dataset), world_size))


def make_loaders(
    num_train: int,
    num_val: int,
    batch_size: int,
    seed: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    stateful: bool = True,
    num_points: int = 512,
):
    """Build the training loader and this rank's validation shard.

    The training loader is a ``torchdata`` ``StatefulDataLoader`` (its
    ``state_dict`` is the data cursor that lets a run resume mid-epoch) when
    ``stateful``, else a plain ``DataLoader``. Shuffling is driven by a
    generator seeded with ``seed``; with ``world_size > 1`` a
    ``DistributedSampler(shuffle=True, seed=seed, drop_last=True)`` gives each
    rank its own part of each epoch (the loop must call ``set_epoch``).
    Incomplete batches are dropped so every epoch has the same length.

    Args:
        num_train: training scenes; num_val: validation scenes.
        batch_size: per-rank batch size of the training loader.
        seed: seeds the scenes and the shuffling.
        rank, world_size: this process's place in the group.
        stateful: use ``StatefulDataLoader``.
        num_points: points per scene.

    Returns:
        ``(train_loader, val_shard)`` where ``val_shard`` is
        ``shard(SyntheticScenes(num_val, split="val"), rank, world_size)``.
    """
    train = SyntheticScenes(num_train, num_points=num_points, seed=seed, split="train")
    val = SyntheticScenes(num_val, num_points=num_points, seed=seed, split="val")
    kwargs = dict(batch_size=batch_size, collate_fn=collate, drop_last=True)
    if world_size > 1:
        kwargs["sampler"] = DistributedSampler(
            train, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
    else:
        kwargs.update(shuffle=True, generator=torch.Generator().manual_seed(seed))
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        with warnings.catch_warnings():
            # Its constructor calls torch.set_vital, deprecated since torch 2.x: a warning on every run and rank.
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
            loader = StatefulDataLoader(train, **kwargs)
    else:
        loader = DataLoader(train, **kwargs)
    return loader, shard(val, rank, world_size)
