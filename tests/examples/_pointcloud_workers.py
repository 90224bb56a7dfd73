"""Process entry points for the multi-process example tests (spawned)."""

import json
import os

import torch
import torch.distributed as dist


def evaluate_shard(rank, world_size, port, num_val, out_dir):
    """Join a gloo group, evaluate this rank's shard, write the result as JSON."""
    from pointcloud import Evaluator, PointSegNet, SyntheticScenes, shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)  # identical weights on every rank
        model = PointSegNet(width=16, k=4)
        ds = SyntheticScenes(num_val, num_points=64, split="val", seed=2)
        result = Evaluator(shard(ds, rank, world_size), batch_size=2)(model)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()
