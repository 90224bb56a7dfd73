"""Workers whose Log handler fails alike on every rank (``test_peer_failure_places``)."""

from __future__ import annotations

import torch

import pimm_fn as pf
from _workers import Net, _dump, _failure, _snapshot, loader
from pimm_fn.core.effects import Log

FAIL_AT = 4  # the step whose training record the handler fails on, once, on every rank


def _show(fail: bool):
    """A user's Log handler (the console line replaced) raising once at step FAIL_AT when ``fail``."""
    fired = []

    def show(record, state, ctx):
        if fail and record.step == FAIL_AT and not fired:
            fired.append(record.step)
            raise ValueError(f"injected Log handler failure at step {record.step}")
        return ()

    return show


def _run(save_dir, fail: bool):
    torch.manual_seed(0)
    model = Net()
    return pf.loop(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.01),
        loader(pf.dist.rank(), pf.dist.world_size()),
        hooks=[pf.log_every(2), pf.save_every(4)],
        max_epochs=2,
        save_dir=save_dir,
        watching=pf.Watching(console=False, log_reduce="mean"),  # every rank runs each training Log
        parallel=pf.Parallel(ddp=True),
        handlers={Log: _show(fail)},
    )


def log_fails_alike(rank, world, out, *, save_dir, tag):
    """An uninterrupted run, then one whose Log handler raises at step 4 on every rank, continued with run()."""
    reference = _run(f"{save_dir}/ref", fail=False)
    reference.run()
    result = {"rank": rank, "ref": {**_snapshot(reference), "trace": reference.trace}}
    run = _run(f"{save_dir}/failing", fail=True)
    try:
        run.run()
        raise AssertionError("the injected failure did not raise")
    except ValueError as exc:
        result["error"], result["interrupted"] = _failure(exc), run.interrupted
    run.run()
    result["failing"] = {**_snapshot(run), "trace": run.trace, "history": run.history.records()}
    result["ref"]["history"] = reference.history.records()
    _dump(out, tag, rank, result)
