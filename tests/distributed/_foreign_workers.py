"""Worker function: resuming another layout through a reader handed with the run's handlers, on several ranks.

One launch (``_foreign_workers:foreign``) saves a pimm_fn run, lays a toy layout beside it (a ``model/pointer.txt``
naming that run's checkpoint, rank 0 writes it), then every rank resumes and refuses as ``pimm_fn.runtime.resume.resume``
decides, and records what it got and which paths its reader was asked about (rank 0 alone is ever asked).
"""

from __future__ import annotations

import pathlib
import sys

import torch

import pimm_fn as pf
from _workers import Net, _dump, loader
from pimm_fn import dist

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))  # after the workers' own dir
from _pointer_layout import Note, PointerReader  # noqa: E402


def _loop(rank, world, save_dir, *, resume=None, handlers=None, max_epochs=2):
    torch.manual_seed(0)
    model = Net()
    return pf.loop(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.01),
        loader(rank, world),
        hooks=[pf.save_every(4)],
        max_epochs=max_epochs,
        save_dir=save_dir,
        resume=resume,
        handlers=handlers,
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(ddp=True),
    )


def foreign(rank, world, out, *, save_dir, tag):
    root = pathlib.Path(save_dir)
    _loop(rank, world, root / "ours", max_epochs=1)()  # 6 steps: saves at 4 and 6
    toy = root / "toy" / "model"
    if rank == 0:
        toy.mkdir(parents=True)
        (toy / "pointer.txt").write_text(str(root / "ours" / "model" / "last"))
    dist.run_on_main(lambda: None)  # the toy layout is there before any rank looks
    reader = PointerReader()
    handlers = {Note: reader}
    result = {"rank": rank}
    step = lambda save_dir, resume: (
        _loop(rank, world, save_dir, resume=resume, handlers=handlers).state.progress.global_step
    )
    result["auto over toy"] = step(root / "toy", "auto")
    result["path to toy"] = step(root / "b", toy)
    try:
        _loop(rank, world, root / "toy", handlers=handlers)
        result["fresh over toy"] = None
    except FileExistsError as exc:
        result["fresh over toy"] = str(exc)
    result["auto over ours"] = step(root / "ours", "auto")
    result["auto over nothing"] = step(root / "empty", "auto")
    result["looks"] = reader.looks
    return _dump(out, tag, rank, result)
