"""Workers counting the tensor reads of a 2-rank DDP run (``test_no_host_sync``)."""

from __future__ import annotations

import sys
import pathlib

import torch
from torch.utils.data import DataLoader, DistributedSampler

import pimm_fn as pf
from _workers import BATCH, Net, ValLoss, _dump, dataset

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
from _sync_count import reads_per_step  # noqa: E402

HOOKS_CADENCES = (5, 8, 10)  # evaluate_every, save_every, log_every


def count_reads(rank, world, out, *, save_dir, tag):
    """Train the standard stack under DDP, recording the tensor reads of each step() call."""
    torch.manual_seed(0)
    model = Net()
    sampler = DistributedSampler(dataset(), num_replicas=world, rank=rank, shuffle=False)
    data = DataLoader(dataset(), batch_size=BATCH, sampler=sampler)
    hooks = [
        pf.evaluate_every(5, ValLoss(), name="val"),
        pf.save_every(8),
        pf.best_on("val_loss", mode="min"),
        pf.log_every(10),
    ]
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        data,
        hooks=hooks,
        max_epochs=3,
        save_dir=save_dir,
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(ddp=True),
    )
    reads = reads_per_step(run)
    _dump(out, tag, rank, {"reads": reads, "iters_per_epoch": run.state.progress.iters_per_epoch})
