"""Workers logging a 2-rank DDP run's training outputs: rank 0's, or their mean (``test_log_reduce``)."""

from __future__ import annotations

import torch

import pimm_fn as pf
from _workers import Net, _dump, loader

EVERY = 3  # log_every's cadence; the recording hook reads the outputs on the same steps


def log_over_ranks(rank, world, out, *, save_dir, tag):
    """Train twice, log_reduce=None then "mean"; each rank keeps the losses it saw and its history."""
    results = {}
    for reduce in (None, "mean"):
        torch.manual_seed(0)
        model = Net()
        seen = {}

        def record(state, event):
            seen[event.step] = event.outputs["loss"]
            return state, ()

        record.events, record.every = (pf.events.AfterStep,), EVERY
        run = pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01),
            loader(rank, world),
            hooks=[pf.log_every(EVERY), record],
            max_epochs=1,
            save_dir=f"{save_dir}/{reduce}",
            watching=pf.Watching(console=False, log_reduce=reduce, progress=rank == 0),
            parallel=pf.Parallel(ddp=True),
        )  # rank 0 decides: a bar
        run()
        last = repr(run.hooks.hooks[-1])
        results[str(reduce)] = {"seen": seen, "history": run.history.records(), "last hook": last}
    _dump(out, tag, rank, results)
