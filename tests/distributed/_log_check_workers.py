"""Workers of ``test_log_reduce_check``: ranks logging different training records under ``log_reduce="mean"``."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as td

import pimm_fn as pf
from pimm_fn.runtime.step.train_step import train_step
from _workers import Net, _dump, loader


def _step_adding(extra: dict):
    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        return {**train_step(model, optimizer, batch, scheduler=scheduler, scaler=scaler), **extra}

    return step


def differing_records(rank, world, out, *, save_dir, tag):
    """Equal names average; then rank 1's step returns one more output: every rank fails at step 2, none hangs."""
    if not td.is_initialized():
        td.init_process_group(backend="gloo")
    results = {}
    for case, extra in (("same", {"extra": float(rank)}), ("names", {"extra": 1.0} if rank == 1 else {})):
        torch.manual_seed(0)
        model = Net()
        run = pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01),
            loader(rank, world),
            hooks=[pf.log_every(2)],
            max_epochs=1,
            save_dir=f"{save_dir}/{case}",
            step_fn=_step_adding(extra),
            parallel=pf.Parallel(ddp=True),
            watching=pf.Watching(console=False, log_reduce="mean", progress=False),
        )
        try:
            run()
            results[case] = {"step": run.state.progress.global_step, "history": run.history.records()}
        except Exception as error:  # noqa: BLE001 - what each rank raised is the result
            results[case] = {
                "step": run.state.progress.global_step,
                "error": type(error).__name__,
                "message": str(error),
            }
    _dump(out, tag, rank, results)
    if not td.is_initialized():  # ranks failing at different effects shut the group down (runtime/peers.py)
        time.sleep(1)  # rank 0 hosts the store: let the peer finish reading the failure reports
        os._exit(0)
