"""Workers of the configured-step tests: DDP training with ``TrainStep``, counting gradient all-reduces.

Run through ``_launch.run_ranks("_step_workers:accumulate", 2, out, ...)``.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import pimm_fn as pf
from _workers import MAX_EPOCHS, Net, _dump, loader


def _counting_allreduce(state: dict, bucket):
    """DDP's own all-reduce of a gradient bucket, counted in ``state``."""
    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def _buckets_per_backward(rank, world) -> int:
    """The all-reduces one synced backward of ``Net`` issues under DDP (its gradient buckets)."""
    model = DistributedDataParallel(Net())
    counter = {"calls": 0}
    model.register_comm_hook(counter, _counting_allreduce)
    model(next(iter(loader(rank, world))))["loss"].backward()
    return counter["calls"]


def accumulate(rank, world, out, *, k, tag):
    """Train with ``TrainStep(accumulate=k)`` under DDP; dump the all-reduce count, steps and weights."""
    torch.manual_seed(0)
    model = DistributedDataParallel(Net())
    counter = {"calls": 0}
    model.register_comm_hook(counter, _counting_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stepped = []
    optimizer.register_step_post_hook(lambda *args: stepped.append(1))
    run = pf.loop(model, optimizer, loader(rank, world), max_epochs=MAX_EPOCHS, watching=pf.Watching(console=False),
                  step_fn=pf.TrainStep(accumulate=k))
    run()
    _dump(out, tag, rank, {
        "calls": counter["calls"], "buckets": _buckets_per_backward(rank, world), "optimizer_steps": len(stepped), "global_step": run.state.progress.global_step,
        "weights": {name: t.detach().clone() for name, t in model.module.state_dict().items()},
    })
