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
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        max_epochs=MAX_EPOCHS,
        watching=pf.Watching(console=False),
        step_fn=pf.TrainStep(accumulate=k),
    )
    run()
    _dump(
        out,
        tag,
        rank,
        {
            "calls": counter["calls"],
            "buckets": _buckets_per_backward(rank, world),
            "optimizer_steps": len(stepped),
            "global_step": run.state.progress.global_step,
            "weights": {name: t.detach().clone() for name, t in model.module.state_dict().items()},
        },
    )


def mse(output, target):
    """The supervised step's loss: a regression's, one number a batch."""
    return torch.nn.functional.mse_loss(output.squeeze(-1), target)


def supervised(rank, world, out, *, tag):
    """TrainStep(loss_fn=) under DDP with accumulation, clipping and on_nonfinite='skip', one NaN sample in the data."""
    import warnings

    from torch.utils.data import DistributedSampler, TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    from _workers import BATCH, dataset

    x, y = dataset().tensors
    x = x.clone()
    x[5, 0] = float("nan")  # one sample of 48: on one rank's shard each epoch, so one rank's loss only
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        StatefulDataLoader(data, batch_size=BATCH, sampler=sampler),
        step_fn=pf.TrainStep(loss_fn=mse, accumulate=2, clip_grad_norm=1.0),
        max_epochs=MAX_EPOCHS,
        training=pf.Training(on_nonfinite="skip"),
        parallel=pf.Parallel(ddp=True),
        watching=pf.Watching(console=False, progress=False),
    )
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        state = run()
    _dump(
        out,
        tag,
        rank,
        {
            "skips": [str(w.message) for w in said if issubclass(w.category, pf.NonFiniteLossWarning)],
            "global_step": state.progress.global_step,
            "summary": str(state),
            "weights": {name: t.detach().clone() for name, t in model.state_dict().items()},
        },
    )
