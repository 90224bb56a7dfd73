"""Worker functions for resumes on another world size (run as ``_world_workers:<function>``, see ``_launch``).

The run is ``_workers``' tiny one (48 samples, batch 4, 3 epochs, a
``DistributedSampler`` with seed 7) whose samples carry their index, so a
test can tell which samples every step of every rank trained on.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import pimm_fn as pf
from _workers import BATCH, MAX_EPOCHS, Net, _dump, _snapshot, dataset


class Tracking(Net):
    """``Net`` that remembers the sample indices of every training batch."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, batch):
        x, y, index = batch
        if self.training:
            self.seen.append(index.tolist())
        return super().forward((x, y))


class OwnSampler(DistributedSampler):
    """A sampler of the user's own (here dealing as its base does): its epochs cannot be positioned."""


def indexed(samples: int | None = None) -> TensorDataset:
    x, y = dataset().tensors
    n = samples or len(x)
    return TensorDataset(x[:n], y[:n], torch.arange(n))


def loader(rank, world, *, sampler="distributed", kind="stateful", num_workers=0, batch=BATCH, samples=None):
    data = indexed(samples)
    cls = OwnSampler if sampler == "own" else DistributedSampler
    chosen = cls(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    make = StatefulDataLoader if kind == "stateful" else DataLoader
    return make(data, batch_size=batch, sampler=chosen, num_workers=num_workers)


def hooks():
    return [pf.save_every(3, snapshots=True)]


def _build(rank, world, save_dir, resume, strict, data):
    torch.manual_seed(0)
    model = Tracking()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world, **data),
        hooks=hooks(),
        max_epochs=MAX_EPOCHS,
        save_dir=save_dir,
        resume=resume,
        resuming=pf.Resuming(strict_resume=strict),
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(ddp=True),
    )
    return run, model


def train(rank, world, out, *, save_dir, tag, resume=None, steps=None, strict_first=False, **data):
    """Train (or resume and train) the indexed run; dump progress, trace, warnings and the samples of every step."""
    result = {"rank": rank, "world": world}
    if strict_first:  # the same resume under strict_resume=True: refused, or accepted
        try:
            _build(rank, world, save_dir, resume, True, data)
            result["strict"] = None
        except pf.ResumeError as exc:
            result["strict"] = str(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run, model = _build(rank, world, save_dir, resume, False, data)
        result["restored"] = _snapshot(run)
        run.run(steps=steps)
    result["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
    result["final"] = _snapshot(run)
    result["trace"] = list(run.trace)
    result["seen"] = model.seen
    return _dump(out, tag, rank, result)
