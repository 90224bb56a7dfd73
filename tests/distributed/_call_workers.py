"""Workers of a 2-rank DDP run whose hook asks for functions by name on each scope (``test_call_ranks``)."""

from __future__ import annotations

import pathlib
from typing import ClassVar

import attrs
import torch
import torch.distributed as td

import pimm_fn as pf
from pimm_fn.core.effects import Call, Scope
from _workers import Net, _dump, loader

EVERY = 3


def record(state, ctx, label):
    """Append this rank's step to ``calls-<label>-rank<r>.txt`` under the run's save_dir."""
    with open(pathlib.Path(ctx.save_dir) / f"calls-{label}-rank{ctx.rank}.txt", "a") as file:
        file.write(f"{state.progress.global_step}\n")


def sum_ranks(state, ctx):
    """A function that communicates: every rank must call it, in the same order (Scope.COLLECTIVE)."""
    total = torch.tensor([float(ctx.rank + 1)])
    td.all_reduce(total)
    record(state, ctx, f"sum{int(total.item())}")


@attrs.frozen
class AskEveryScope:
    """Every ``EVERY`` steps: record on the main rank, record on every rank, and a sum over the ranks."""

    events: ClassVar[tuple] = (pf.events.AfterStep,)
    emits: ClassVar[tuple] = (Call,)
    rank_consistent: ClassVar[bool] = True
    every: ClassVar[int] = EVERY

    def __call__(self, state, event):
        return state, (
            Call.of(record, event.step, args=("main",)),
            Call.of(record, event.step, args=("every",), scope=Scope.LOCAL),
            Call.of(sum_ranks, event.step, scope=Scope.COLLECTIVE),
        )


def call_on_scopes(rank, world, out, *, save_dir, tag):
    """Train one epoch with AskEveryScope; dump each rank's executed effects and the plan."""
    torch.manual_seed(0)
    model = Net()
    hooks = [AskEveryScope()]
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader(rank, world),
        hooks=hooks,
        max_epochs=1,
        save_dir=save_dir,
        watching=pf.Watching(console=False, progress=False),
        parallel=pf.Parallel(ddp=True),
    )
    run()
    planned = pf.plan(hooks, iters_per_epoch=run.state.progress.iters_per_epoch, max_epochs=1)
    _dump(out, tag, rank, {"executed": [e.effect for e in run.trace], "planned": [e.effect for e in planned]})
