"""A small writer of pimm's checkpoint layouts (PIMM.md 3.2-3.4), for tests: real torch.save, real DCP.

``pimm_saver(layouts)`` is a ``SaveCheckpoint`` handler that writes, instead
of pimm_fn's checkpoint, the layouts pimm writes for the same state: the
split ``model/last/`` (``weights.pth`` + ``trainer.dcp/`` + ``.complete``
markers), pimm's one-file ``model_last.pth`` (the whole payload), or an older
Pointcept-style ``model_last.pth`` (``epoch``/``iter``, no RNG).
"""

import os
import pickle
import random
import shutil

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from pimm_fn.runtime.engine.interpreter import unwrap


def pimm_rng() -> dict:
    """pimm's capture_rng_state: Python, NumPy (an ndarray inside) and torch states, as pimm pickles them."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def next_position(progress) -> tuple[int, int]:
    """TrainState.from_trainer: the next resume point (epoch, iter_in_epoch), rolled over at the epoch's end."""
    if progress.iter_in_epoch >= progress.iters_per_epoch:
        return progress.epoch + 1, 0
    return progress.epoch, progress.iter_in_epoch


def payload(ctx, state, *, best=None) -> dict:
    """build_checkpoint_payload for a single process."""
    model = unwrap(ctx.model)
    epoch, iteration = next_position(state.progress)
    scheduler = ctx.scheduler
    cursor = {"format": "pimm.torchdata_state.v1", "state": pickle.dumps({"samples_yielded": 0})}
    return {
        "schema": "pimm.trainer_checkpoint",
        "version": 3,
        "checkpoint_version": 3,
        "model": {"state_dict": model.state_dict()},
        "optimizer": {
            "state_dict": get_optimizer_state_dict(model, ctx.optimizer, options=StateDictOptions()),
            "class": type(ctx.optimizer).__name__,
            "format": "torch.distributed.checkpoint.state_dict",
        },
        "scheduler": {
            "state_dict": scheduler.state_dict() if scheduler else None,
            "class": type(scheduler).__name__,
            "total_steps": getattr(scheduler, "total_steps", None),
        },
        "scaler": {"enabled": False, "state_dict": None},
        "dataloader": {
            "backend": "DataLoader",
            "world_size": 1,
            "batch_size_per_rank": 4,
            "num_workers": 0,
            "drop_last": False,
            "state": {"_pimm_distributed_state": True, "world_size": 1, "states": [cursor]},
        },
        "rng": {"world_size": 1, "state": {"world_size": 1, "states": [pimm_rng()]}},
        "trainer": {
            "epoch": epoch,
            "iter_in_epoch": iteration,
            "global_step": state.progress.global_step,
            "samples_seen": state.progress.samples_seen,
            "best_metric_value": best,
        },
        "logger": {"backend": "tensorboard", "wandb": {"run_id": None, "resume_step": None}},
        "distributed": {"world_size": 1, "backend": None, "rank_order": [0]},
    }


def _complete(directory) -> None:
    with open(os.path.join(directory, ".complete"), "w") as f:
        f.write("ok\n")


def write_split(model_dir, full: dict) -> None:
    """save_split_checkpoint: last.tmp/ with weights.pth, trainer.dcp/ (DCP + .complete), .complete; renamed to last/."""
    tmp, last = os.path.join(model_dir, "last.tmp"), os.path.join(model_dir, "last")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    torch.save({"state_dict": full["model"]["state_dict"]}, os.path.join(tmp, "weights.pth"))
    trainer = os.path.join(tmp, "trainer.dcp")
    dcp.save({k: v for k, v in full.items() if k != "model"}, checkpoint_id=trainer, no_dist=True)
    _complete(trainer)
    _complete(tmp)
    shutil.rmtree(last, ignore_errors=True)
    os.rename(tmp, last)


def write_file(model_dir, content: dict) -> None:
    """atomic_torch_save of model_last.pth."""
    tmp = os.path.join(model_dir, "model_last.pth.tmp")
    torch.save(content, tmp)
    os.replace(tmp, os.path.join(model_dir, "model_last.pth"))


def pointcept(ctx, state) -> dict:
    """An older Pointcept-style file: epoch (completed epochs), iter, positional optimizer, no RNG."""
    epoch, iteration = next_position(state.progress)
    return {
        "epoch": epoch,
        "iter": iteration,
        "state_dict": unwrap(ctx.model).state_dict(),
        "optimizer": ctx.optimizer.state_dict(),
        "scheduler": ctx.scheduler.state_dict() if ctx.scheduler else None,
        "scaler": None,
        "best_metric_value": float("-inf"),
    }


def pimm_saver(layout: str, *, best=None):
    """A SaveCheckpoint handler writing ``layout`` ("split", "file" or "pointcept") under ctx.model_dir."""

    def save(effect, state, ctx):
        os.makedirs(ctx.model_dir, exist_ok=True)
        if layout == "split":
            write_split(ctx.model_dir, payload(ctx, state, best=best))
        elif layout == "file":
            write_file(ctx.model_dir, payload(ctx, state, best=best))
        else:
            write_file(ctx.model_dir, pointcept(ctx, state))
        return ()

    return save
