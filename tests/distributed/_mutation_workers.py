"""Workers of test_mutated_checkpoints_ranks: genuine DDP and FSDP2 checkpoints, altered, resumed on 2 gloo ranks.

Run through ``_launch.run_ranks("_mutation_workers:mutated", 2, ...)``. Each
rank trains a DDP and an FSDP2 model for one epoch (a genuine checkpoint
each), then, for every mutation of a fixed representative list, republishes
the checkpoint collectively with pimm_fn's writer (the live shards beside it)
with that one change, and resumes it into a fresh DDP model and a fresh FSDP2
model. It records, per case, ``"ok"`` or the refusal's type and text, and
whether the payload's marker file appeared. Any other exception fails the rank.
"""

from __future__ import annotations

import pathlib
import sys

import torch.distributed as td

import pimm_fn as pf
from pimm_fn.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from pimm_fn.checkpoint.formats import sharded
from _fsdp_workers import build_model, build_optimizer
from _workers import _dump, loader

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "checkpoint"))
from _crafted import Payload  # noqa: E402

# name -> (what changes, key, value); "claim" is the crafted exploit: sharded=True and pickled model shards.
MUTATIONS = {
    "genuine": ("none", None, None),
    "claim": ("claim", None, None),
    "flag": ("flip", "sharded", None),
    "optimizer-type": ("trainer", "optimizer", "x"),
    "trainer-entry": ("entry", "trainer/t/0", None),
    "rank1-entry": ("entry", "local/rank1/skeleton", None),
    "rank1-rng": ("rank1", "rng", "x"),  # one rank's part alone: refused on both, no rank left waiting
    "shard-entry": ("entry", "sharded/model/body.0.weight", None),
}


def _republish(genuine: pathlib.Path, model_dir: pathlib.Path, mutation, shards: dict, marker) -> pathlib.Path:
    """The genuine checkpoint written again, collectively, with one change; ``shards``: this rank's live shards."""
    what, key, value = mutation
    loaded = load_checkpoint(find_checkpoint(genuine))
    trainer, local, entries = dict(loaded.trainer), dict(loaded.local), dict(shards)
    if what == "claim":
        trainer.update(sharded=True, optimizer={"state": {}, "param_groups": None})
        entries.update({f"sharded/model/{name}": Payload(marker) for name in loaded.weights})
    elif what == "flip":
        trainer["sharded"] = not trainer.get("sharded", False)
    elif what == "trainer":
        trainer[key] = value
    elif what == "entry":
        entries[key] = Payload(marker)
    elif what == "rank1" and td.get_rank() == 1:
        local[key] = value
    return save_checkpoint(
        model_dir,
        step=loaded.info.step,
        weights=dict(loaded.weights),
        trainer=trainer,
        local=local,
        sharded=entries or None,
    ).path


def _resume(path: pathlib.Path, into: str, save_dir: pathlib.Path, rank: int, world: int) -> str:
    model = build_model(into)
    try:
        run = pf.loop(
            model,
            build_optimizer(model, "adam"),
            loader(rank, world),
            hooks=[pf.save_every(100)],
            max_epochs=2,
            save_dir=save_dir,
            resume=str(path),
            watching=pf.Watching(console=False),
            parallel=pf.Parallel(ddp=into == "ddp"),
        )
        run.run(steps=1)
    except (pf.CheckpointError, pf.ResumeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def mutated(rank, world, out, *, root):
    """Every mutation of each kind's genuine checkpoint, resumed into DDP and FSDP2: what each rank saw."""
    root = pathlib.Path(root)
    seen = {}
    for kind in ("ddp", "fsdp"):
        model = build_model(kind)
        optimizer = build_optimizer(model, "adam")
        pf.loop(
            model,
            optimizer,
            loader(rank, world),
            hooks=[pf.save_every(100)],
            max_epochs=1,
            save_dir=root / kind,
            watching=pf.Watching(console=False),
            parallel=pf.Parallel(ddp=kind == "ddp"),
        )()
        genuine = root / kind / "model" / "last"
        shards = sharded.state(model, optimizer)[0] if kind == "fsdp" else {}
        for name, mutation in MUTATIONS.items():
            if name == "shard-entry" and kind != "fsdp":
                continue
            marker = root / f"{kind}-{name}.ran"
            crafted = _republish(genuine, root / f"{kind}-{name}" / "model", mutation, shards, marker)
            for into in ("ddp", "fsdp"):
                outcome = _resume(crafted, into, root / f"{kind}-{name}-into-{into}", rank, world)
                td.barrier()
                seen[f"{kind}/{name}->{into}"] = (outcome, marker.exists())
    _dump(out, "mutated", rank, seen)
