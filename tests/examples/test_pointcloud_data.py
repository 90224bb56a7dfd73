"""The synthetic scenes: determinism, label range, loaders and shards."""

import pickle

import pytest
import torch

from pointcloud import NUM_CLASSES, SyntheticScenes, collate, make_loaders, shard


def test_sample_is_a_pure_function_of_seed_split_and_index():
    """Two datasets built alike return equal tensors for the same index."""
    a, b = SyntheticScenes(5, num_points=128, seed=3), SyntheticScenes(5, num_points=128, seed=3)
    for i in (0, 4, 2):
        for key in ("coord", "feat", "segment"):
            assert torch.equal(a[i][key], b[i][key])


def test_different_seed_split_or_index_give_different_scenes():
    """Changing any of (seed, split, index) changes the scene."""
    base = SyntheticScenes(3, num_points=128, seed=0)[1]["coord"]
    others = [
        SyntheticScenes(3, num_points=128, seed=1)[1],
        SyntheticScenes(3, num_points=128, seed=0, split="val")[1],
        SyntheticScenes(3, num_points=128, seed=0)[2],
    ]
    assert all(not torch.equal(base, o["coord"]) for o in others)


def test_sample_shapes_dtypes_and_labels_in_range():
    """Each sample has N points, float32 features and int64 labels in range."""
    ds = SyntheticScenes(20, num_points=256, seed=7)
    seen = set()
    for i in range(len(ds)):
        s = ds[i]
        assert s["coord"].shape == (256, 3) and s["coord"].dtype == torch.float32
        assert s["feat"].shape == (256, 7) and s["feat"].dtype == torch.float32
        assert s["segment"].shape == (256,) and s["segment"].dtype == torch.int64
        assert s["segment"].min() >= 0 and s["segment"].max() < NUM_CLASSES
        assert torch.isfinite(s["feat"]).all()
        seen |= set(s["segment"].tolist())
    assert seen == set(range(NUM_CLASSES))


def test_dataset_pickles_and_rejects_bad_arguments():
    """The dataset survives pickling (spawned processes) and validates arguments."""
    ds = SyntheticScenes(2, num_points=64)
    assert torch.equal(pickle.loads(pickle.dumps(ds))[1]["coord"], ds[1]["coord"])
    with pytest.raises(ValueError, match="split"):
        SyntheticScenes(2, split="dev")
    with pytest.raises(IndexError):
        ds[2]


def test_collate_stacks_into_batch_tensors():
    """collate stacks B samples into [B, N, ...] tensors."""
    ds = SyntheticScenes(3, num_points=64)
    b = collate([ds[i] for i in range(3)])
    assert b["feat"].shape == (3, 64, 7) and b["segment"].shape == (3, 64)


@pytest.mark.parametrize("n, world", [(10, 1), (10, 2), (11, 3), (2, 4)])
def test_shards_are_disjoint_and_cover_every_index_once(n, world):
    """The union of all ranks' shards is the whole set, each index exactly once."""
    indices = [i for r in range(world) for i in shard(range(n), r, world).indices]
    assert sorted(indices) == list(range(n))


def test_make_loaders_shuffle_is_seeded_and_stateful():
    """Same seed, same order; the loader's state_dict resumes mid-epoch exactly."""

    def first_batches(loader, k):
        it = iter(loader)
        return [next(it)["coord"] for _ in range(k)]

    a, val = make_loaders(16, 6, 4, seed=5, num_points=64)
    b, _ = make_loaders(16, 6, 4, seed=5, num_points=64)
    assert len(a) == 4 and len(val) == 6
    assert all(torch.equal(x, y) for x, y in zip(first_batches(a, 4), first_batches(b, 4)))

    c, _ = make_loaders(16, 6, 4, seed=5, num_points=64)
    it = iter(c)
    next(it)
    state = c.state_dict()
    expected = [next(it)["coord"] for _ in range(3)]
    d, _ = make_loaders(16, 6, 4, seed=5, num_points=64)
    d.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(expected, [b["coord"] for b in d], strict=True))


def test_make_loaders_distributed_ranks_split_each_epoch():
    """With world_size 2 the ranks' training batches are disjoint within an epoch."""
    seen = []
    for rank in range(2):
        train, val = make_loaders(16, 5, 2, seed=1, rank=rank, world_size=2, num_points=64)
        assert len(train) == 4 and len(val) == (3 if rank == 0 else 2)
        seen.append({tuple(b["coord"][i, 0].tolist()) for b in train for i in range(2)})
    assert len(seen[0]) == len(seen[1]) == 8 and not seen[0] & seen[1]
