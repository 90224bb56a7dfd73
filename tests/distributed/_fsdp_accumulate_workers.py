"""Workers of ``test_fsdp_accumulation``: a FSDP2 model trained with ``TrainStep(accumulate=2)`` on gloo ranks.

One launch trains, on every rank: FSDP2 accumulating 2 micro-batches of 4 for the whole run; the same
stopped after step 4 (its checkpoint) and resumed from it in a new loop; and the reference, the same model
unsharded under DDP with batches of 8 (the two micro-batches as one) and no accumulation.
"""

from __future__ import annotations

import torch
import torch.distributed as td
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

import pimm_fn as pf
from _fsdp_workers import build_model, full_state
from _workers import _dump, dataset

EPOCHS = 2  # 24 samples a rank: 3 optimizer steps an epoch, 6 in all
STOP = 4  # the partial run stops here, on its checkpoint (mid-epoch 2)


def _loader(rank: int, world: int, batch: int) -> StatefulDataLoader:
    sampler = DistributedSampler(dataset(), num_replicas=world, rank=rank, shuffle=True, seed=7)
    return StatefulDataLoader(dataset(), batch_size=batch, sampler=sampler)


def _run(rank, world, save_dir, *, kind: str, resume=None):
    model = build_model(kind)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    accumulate = kind == "fsdp"
    run = pf.loop(
        model,
        optimizer,
        _loader(rank, world, 4 if accumulate else 8),
        hooks=[pf.save_every(2)],
        max_epochs=EPOCHS,
        save_dir=save_dir,
        resume=resume,
        step_fn=pf.TrainStep(accumulate=2) if accumulate else None,
        watching=pf.Watching(console=False, progress=False),
        parallel=pf.Parallel(ddp=kind == "ddp"),
    )
    return model, optimizer, run


def accumulate(rank, world, out, *, save_dir, tag):
    """Dump the gathered final state of each of the three runs, and the resumed run's restored state."""
    if not td.is_initialized():
        td.init_process_group(backend="gloo")
    result = {}
    model, optimizer, run = _run(rank, world, f"{save_dir}/whole", kind="fsdp")
    run()
    result["whole"] = full_state(model, optimizer)
    result["steps"] = run.state.progress.global_step
    model, optimizer, run = _run(rank, world, f"{save_dir}/partial", kind="fsdp")
    run.run(steps=STOP)
    result["stopped"] = full_state(model, optimizer)
    run.ctx.close()
    model, optimizer, run = _run(rank, world, f"{save_dir}/partial", kind="fsdp", resume="auto")
    result["resumed_at"] = run.state.progress.global_step
    result["restored"] = full_state(model, optimizer)
    run()
    result["resumed"] = full_state(model, optimizer)
    model, optimizer, run = _run(rank, world, f"{save_dir}/ddp", kind="ddp")
    run()
    result["reference"] = full_state(model, optimizer)
    _dump(out, tag, rank, result)
