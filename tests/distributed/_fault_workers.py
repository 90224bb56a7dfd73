"""Worker functions for damaged checkpoints and full disks on several ranks (run as ``_fault_workers:<function>``).

One launch covers every case, in turn, so the processes start once: a run
is saved, then for each damage rank 0 copies it and damages one file of the
copy's ``last/``, and every rank resumes from it (``auto`` and by path);
then full disks are injected at a write of one rank and every rank must
raise, and resume exactly once the space is back. ``unwritable`` builds a
run whose save_dir one rank cannot write (test_unwritable_ranks.py).
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import torch

import pimm_fn as pf
from _workers import Net, _dump, loader
from pimm_fn import dist
from pimm_fn.checkpoint import DiskFullError
from pimm_fn.runtime.engine.interpreter import unwrap

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "checkpoint"))  # after the workers' own dir
from _disk_faults import damage, full_disk  # noqa: E402

# Chosen for agreement: rank 1's data file overwritten at the same size passes rank 0's size check and fails
# only where it is read; the others are told by the sizes the marker records, on rank 0.
DAMAGES = [
    ("trainer/__1_0.distcp", "garbage"),
    ("trainer/__1_0.distcp", "delete"),
    ("trainer/__0_0.distcp", "zeros"),
    ("trainer/.metadata", "garbage"),
    ("model.pth", "truncate"),
    ("COMPLETE", "garbage"),
]
# (file that fills up, background save): a write of rank 1 only, of rank 0 only, and the marker of a background save.
FULL = [("__1_0.distcp", False), ("model.pth", False), ("COMPLETE", True)]


def _build(rank, world, save_dir, *, resume=None, async_save=False, fmt="standard"):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=[pf.save_every(4, snapshots=True, async_save=async_save)],
        max_epochs=2,
        save_dir=save_dir,
        resume=resume,
        saving=pf.Saving(checkpoint_format=fmt),
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(ddp=True),
    )
    return model, run


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in unwrap(model).state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def faults(rank, world, out, *, save_dir, tag):
    """Save a 12-step run, then resume from damaged copies of it, then fill the disk during saves."""
    root = pathlib.Path(save_dir)
    model, run = _build(rank, world, root / "saved")
    run()
    final = _weights(model)
    result = {"rank": rank, "damaged": {}, "full": {}}
    for name, how in DAMAGES:
        result["damaged"][f"{name}:{how}"] = _damaged(rank, world, root, name, how, final)
    for site, background in FULL:
        result["full"][f"{site}:{background}"] = _full(
            rank, world, root / f"full-{site}-{background}", site, background, final
        )
    return _dump(out, tag, rank, result)


def _damaged(rank, world, root, name, how, final) -> dict:
    case = root / f"damaged-{name.replace('/', '_')}-{how}"
    if rank == 0:
        shutil.copytree(root / "saved", case)  # copies: iter_12 stays whole
        damage(case / "model" / "last" / name, how)
    dist.barrier()
    model, run = _build(rank, world, case, resume="auto")
    found = {"auto_step": run.state.progress.global_step, "auto_same": _same(_weights(model), final)}
    try:
        _build(rank, world, case, resume=case / "model" / "last")
        found["explicit"] = None
    except pf.CheckpointError as exc:
        found["explicit"] = (exc.path, exc.file, str(exc))
    return found


def _full(rank, world, run_dir, site, background, final) -> dict:
    model_dir = run_dir / "model"
    _, run = _build(rank, world, run_dir, async_save=background)
    run.run(steps=5)
    run.ctx.wait_for_save()
    found = {}
    with full_disk(model_dir, site) as hits:
        try:
            run.run()
            found["error"] = None
        except Exception as exc:  # noqa: BLE001 - the test reads what each rank raised
            found["error"] = (type(exc).__name__, str(exc), isinstance(exc, DiskFullError))
    found["hit"] = bool(hits)
    dist.barrier()
    found["staging"] = sorted(p.name for p in model_dir.glob(".staging-*"))
    model, resumed = _build(rank, world, run_dir, resume="auto")
    found["resumed_at"] = resumed.state.progress.global_step
    resumed()
    found["same"] = _same(_weights(model), final)
    return found


def unwritable(rank, world, out, *, save_dirs, tag):
    """Build a run in each format, each rank at its own ``save_dirs[rank]`` (a node's own mount); what each raised."""
    result = {"rank": rank}
    for fmt in ("standard", "legacy"):
        try:
            _build(rank, world, save_dirs[rank], fmt=fmt)
            result[fmt] = None
        except Exception as exc:  # noqa: BLE001 - the test reads what each rank raised
            result[fmt] = (type(exc).__name__, str(exc))
    return _dump(out, tag, rank, result)
