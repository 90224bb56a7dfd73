"""Train a small point-cloud segmentation model with pimm_fn.

Synthetic scenes, a tiny PointNet-style network, AdamW with a warm-up and
cosine schedule, evaluation (mIoU over a sharded validation set) at each epoch's
end, a rolling checkpoint every epoch and ``model_best`` on the best mIoU.
About a minute on two CPU cores.

    python examples/train_pointcloud.py                       # one process
    python examples/train_pointcloud.py --resume              # continue from runs/pointcloud
    python examples/train_pointcloud.py --resume --epochs 12  # carry a finished run on to 12 epochs
    python examples/train_pointcloud.py --nproc 2             # spawns 2 gloo ranks
    .venv/bin/torchrun --nproc-per-node 2 examples/train_pointcloud.py  # launched by torchrun (the venv's)

With several ranks each one trains on its part of every epoch (a
``DistributedSampler``) and evaluates its shard of the validation set; the
evaluator all-reduces the confusion matrix, so mIoU is of the whole set.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    import pimm_fn as pf
except ImportError:  # running from a checkout without installing the package
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import pimm_fn as pf

from pointcloud import Evaluator, PointSegNet, make_loaders


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--save-dir", default="runs/pointcloud", help="checkpoints and logs")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --save-dir; a larger --epochs "
        "carries a finished run on (the cosine schedule stretches to the new length)",
    )
    p.add_argument("--nproc", type=int, default=1, help="spawn this many gloo ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="CPU threads, shared by all ranks")
    p.add_argument("--num-train", type=int, default=512, help="training scenes")
    p.add_argument("--num-val", type=int, default=128, help="validation scenes")
    p.add_argument("--points", type=int, default=512, help="points per scene")
    p.add_argument("--batch-size", type=int, default=16, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.nproc < 1 or args.threads < 1:
        p.error("--epochs, --nproc and --threads must be >= 1")
    return args


def warmup_cosine(total_steps: int, warmup: float = 0.15):
    """The learning-rate factor at each step: a linear warm-up, then a cosine down to zero.

    A plain function, so the scheduler's checkpoint holds only its step count:
    a resumed run with more epochs follows the schedule of its new length.
    """
    warmup_steps = max(1, int(warmup * total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build(args, rank: int = 0, world_size: int = 1):
    """Data, model, optimizer, scheduler and evaluator for one rank."""
    train_loader, val_shard = make_loaders(
        args.num_train,
        args.num_val,
        args.batch_size,
        args.seed,
        rank=rank,
        world_size=world_size,
        num_points=args.points,
    )
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    model = PointSegNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.epochs * len(train_loader)))
    return model, optimizer, scheduler, train_loader, Evaluator(val_shard, batch_size=32)


def train(args, rank: int = 0, world_size: int = 1):
    """Run the loop on this rank; returns the final state."""
    torch.set_num_threads(max(1, args.threads // world_size))
    model, optimizer, scheduler, train_loader, evaluator = build(args, rank, world_size)
    iters_per_epoch = len(train_loader)
    start = time.perf_counter()
    try:
        run = pf.loop(
            model,
            optimizer,
            train_loader,
            # An epoch-end save runs after that epoch's evaluation, so it records
            # the epoch's mIoU; best_on writes model_best when mIoU improves.
            hooks=[
                pf.evaluate_every(0, evaluator, name="val"),
                pf.save_every(iters_per_epoch, snapshots=False),
                pf.best_on("mIoU"),
                pf.log_every(10),
            ],
            max_epochs=args.epochs,
            save_dir=args.save_dir,
            scheduler=scheduler,
            resume="auto" if args.resume else None,
            # DistributedDataParallel when there is a process group; a no-op in one process.
            parallel=pf.Parallel(ddp=True),
        )
    except FileExistsError as error:  # the library's advice names loop()'s resume=; this script's is --resume
        raise SystemExit(
            f"train_pointcloud.py: --save-dir {args.save_dir} already holds an earlier run, which a fresh one would "
            f"overwrite: pass --resume to continue it (with a larger --epochs to carry it on), or choose another "
            f"--save-dir"
        ) from error
    state = run()
    if rank == 0:
        best = state.best.get("mIoU") if state.best else None
        final = state.metrics.get("mIoU") if state.metrics else None
        print(
            f"done: {state.progress.global_step} steps, {state.progress.completed_epochs} epochs "
            f"on {world_size} rank(s) in {time.perf_counter() - start:.1f}s; "
            f"best mIoU {_fmt(best)}, final mIoU {_fmt(final)}; "
            f"checkpoints in {os.path.join(args.save_dir, 'model')}"
        )
    return state


def _fmt(x) -> str:
    return "n/a" if x is None else f"{float(x):.4f}"


def _spawned(rank: int, world_size: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        train(args, rank, world_size)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # Launched by torchrun: it owns the processes; join its group.
        dist.init_process_group("gloo")
        try:
            train(args, dist.get_rank(), dist.get_world_size())
        finally:
            dist.destroy_process_group()
    elif args.nproc > 1:
        mp.spawn(_spawned, args=(args.nproc, _free_port(), args), nprocs=args.nproc, join=True)
    else:
        train(args)


if __name__ == "__main__":
    main()
