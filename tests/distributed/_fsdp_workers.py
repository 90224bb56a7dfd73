"""Workers of the sharded-model tests: a tiny FSDP2 (``fully_shard``) model trained on gloo ranks.

Run through ``_launch.run_ranks("_fsdp_workers:train", ...)``. Every world
size joins a process group, one rank included, so that ``fully_shard`` has
a mesh. The same model trains unsharded under DDP (``kind="ddp"``) for the
references the resharded resumes are compared with.
"""

from __future__ import annotations

import copy
import os
import signal

import torch
import torch.distributed as td
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

import pimm_fn as pf
from _workers import MAX_EPOCHS, _dump, dataset, loader


class Net(nn.Module):
    """Two linear layers; the loss of a batch."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, batch):
        x, y = batch
        return {"loss": F.mse_loss(self.body(x).squeeze(-1), y)}


def val_loss(model):
    """The whole set's loss on every rank (a sharded forward is collective: every rank runs it)."""
    with torch.no_grad():
        return {"val_loss": float(model(dataset().tensors)["loss"])}


def build_model(kind: str):
    torch.manual_seed(0)
    model = Net()
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.body[0])
        fully_shard(model.body[2])
        fully_shard(model)
    return model


def build_optimizer(model, name: str):
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=0.01)


def full_state(model, optimizer) -> dict:
    """The gathered model and optimizer state on rank 0 (``{}`` parts elsewhere); collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, optim = get_state_dict(model, optimizer, options=options)
    return copy.deepcopy({"weights": weights, "optimizer": optim})  # plain CPU tensors come back uncopied


def train(
    rank,
    world,
    out,
    *,
    save_dir,
    tag,
    kind="fsdp",
    optim="adam",
    resume=None,
    steps=None,
    save_every=5,
    weights_file=True,
    async_save=False,
    kill_after=None,
):
    """Train (maybe resuming, maybe part of the run), dumping the gathered state restored and reached."""
    if not td.is_initialized():
        td.init_process_group(backend="gloo")
    model = build_model(kind)
    optimizer = build_optimizer(model, optim)
    hooks = [
        pf.evaluate_every(4, val_loss, name="val"),
        pf.save_every(save_every, async_save=async_save),
        pf.best_on("val_loss", mode="min"),
    ]
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=hooks,
        max_epochs=MAX_EPOCHS,
        save_dir=save_dir,
        resume=resume,
        saving=pf.Saving(weights_file=weights_file),
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(ddp=kind == "ddp"),
    )
    # Gathering a fresh optimizer's state would create it (a zero step): only a resumed one is read.
    restored = full_state(model, optimizer) if resume is not None else None
    result = {"rank": rank, "world": world, "restored": restored, "restored_progress": run.state.progress}
    if kill_after is not None:
        run.run(steps=kill_after)
        run.ctx.wait_for_save()
        os.kill(os.getpid(), signal.SIGKILL)
    run.run(steps=steps)
    run.ctx.wait_for_save()
    result.update(
        final=full_state(model, optimizer),
        progress=run.state.progress,
        trace=[repr(entry.effect) for entry in run.trace if entry.effect.__class__.__name__ != "WriteBest"],
        best=dict(run.state.best),
    )
    _dump(out, tag, rank, result)
