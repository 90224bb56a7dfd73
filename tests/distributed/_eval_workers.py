"""Workers evaluating over a DataLoader on several ranks (``test_loader_evaluator_ranks``).

11 samples over 2 ranks: shards of 6 and 5 (a ``DistributedSampler`` would
pad the second to 6 with a repeat), in batches of 2, so each rank's last
batch is short as well.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pimm_fn as pf
from pimm_fn import checkpoint
from _workers import _dump

N = 11
CLASSES = 3


def data() -> TensorDataset:
    """Inputs, labels and each sample's index (to see that no sample is counted twice)."""
    g = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(N, 4, generator=g), torch.randint(0, CLASSES, (N,), generator=g), torch.arange(N))


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, CLASSES)


def sums(outputs, batch):
    """Per-batch sums: right answers, samples, and the samples' indices."""
    _, y, index = batch
    return {"correct": (outputs.argmax(-1) == y).sum(), "count": len(y), "index_sum": index.sum()}


def forward(model, batch):
    return model(batch[0])


def target(batch):
    return batch[1]


def step(model, optimizer, batch, *, scheduler=None, scaler=None):
    x, y, _ = batch
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.detach()}


def _padded_loader(rank, world):
    """What a user writes: a DistributedSampler (which pads), replaced by the evaluator's own shards."""
    ds = data()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False) if world > 1 else None
    return DataLoader(ds, batch_size=2, sampler=sampler)


def evaluate(rank, world, out, *, save_dir, tag):
    """The sums, torchmetrics, a loop with best_on and a sanity check, test on the best weights, a typo refused,
    and best_on of a bare name ('correct' for 'val/correct') refused by the sanity check or the first evaluation."""
    result = {}
    model = classifier()
    totals = pf.loader_evaluator(_padded_loader(rank, world), sums, forward=forward, finish=dict)
    result["totals"] = totals(model)
    result["mean"] = pf.loader_evaluator(_padded_loader(rank, world), sums, forward=forward)(model)
    metric = torchmetrics.classification.MulticlassAccuracy(num_classes=CLASSES, average="micro")
    result["torchmetrics"] = pf.loader_evaluator(
        _padded_loader(rank, world), {"acc": metric}, forward=forward, target=target, name="tm"
    )(model)
    result["sharded"] = _sharded_totals(world) if world > 1 else result["totals"]
    val = pf.loader_evaluator(_padded_loader(rank, world), sums, forward=forward)
    train = DataLoader(
        data(),
        batch_size=2,
        sampler=DistributedSampler(data(), num_replicas=world, rank=rank, shuffle=False) if world > 1 else None,
    )
    model = classifier()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        train,
        step_fn=step,
        hooks=[pf.evaluate_every(1, val), pf.best_on("val/correct")],
        max_epochs=2,
        save_dir=save_dir,
        watching=pf.Watching(console=False, progress=False, sanity_check=1),
        parallel=pf.Parallel(ddp=world > 1),
    )
    run()
    result["best"] = dict(run.state.best)
    result["test best"] = run.test(val, weights="best")
    result["test final"] = run.test(val)
    result["final weights"] = {k: v.clone() for k, v in model.state_dict().items()}
    result["best weights"] = checkpoint.load_weights_file(f"{save_dir}/model/model_best.pth")
    other = classifier()
    try:
        pf.loop(
            other,
            torch.optim.SGD(other.parameters(), lr=0.5),
            train,
            step_fn=step,
            hooks=[pf.evaluate_every(1, val), pf.best_on("val/corect")],
            max_epochs=1,
            save_dir=f"{save_dir}-typo",
            watching=pf.Watching(console=False, progress=False, sanity_check=1),
        )
        result["typo"] = None
    except ValueError as error:
        result["typo"] = str(error)
    result["bare"] = {}
    for sanity in (None, 0):  # the default sanity check refuses it in loop(); without, the first evaluation does
        bare = classifier()
        watching = pf.Watching(console=False, progress=False, sanity_check=sanity)
        try:
            run = pf.loop(
                bare,
                torch.optim.SGD(bare.parameters(), lr=0.5),
                train,
                step_fn=step,
                hooks=[pf.evaluate_every(2, val), pf.best_on("correct")],
                max_epochs=1,
                save_dir=f"{save_dir}-bare-{sanity}",
                watching=watching,
            )
            run()
            result["bare"][sanity] = None
        except ValueError as error:
            result["bare"][sanity] = (str(error), run.state.progress.global_step if sanity == 0 else None)
    if world > 1:  # rank 0 alone has an evaluator: both ranks refuse in the sanity check, neither waits in it
        other = classifier()
        try:
            pf.loop(
                other,
                torch.optim.SGD(other.parameters(), lr=0.5),
                train,
                step_fn=step,
                max_epochs=1,
                hooks=[pf.evaluate_every(1, val)] if rank == 0 else [],
                save_dir=f"{save_dir}-diverged",
                watching=pf.Watching(console=False, progress=False),
            )()
            result["diverged"] = None
        except pf.CollectiveDivergenceError as error:
            result["diverged"] = str(error)
    _dump(out, tag, rank, result)


def _sharded_totals(world) -> dict:
    """An FSDP2 model over batches of 1: 6 forwards on rank 0, 5 on rank 1, plus one uncounted (its forward is collective)."""
    from torch.distributed.fsdp import fully_shard

    model = classifier()
    fully_shard(model)
    with torch.no_grad():
        return pf.loader_evaluator(DataLoader(data(), batch_size=1), sums, forward=forward, finish=dict)(model)
