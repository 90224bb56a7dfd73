"""Workers of the sharded-checkpoint-on-a-store test (``_workers.py _fsdp_store_workers:<function>``).

The S3 server runs in the test process; the ranks reach it through the
``AWS_ENDPOINT_URL`` and credentials its fixture put in the environment.
"""

from __future__ import annotations

import _fsdp_workers as fw
import pimm_fn as pf
from _workers import MAX_EPOCHS, _dump, loader
from pimm_fn.checkpoint import latest_checkpoint
from pimm_fn.checkpoint import storage

SAVED_AT = 5


def _run(rank, world, save_dir, resume=None):
    model = fw.build_model("fsdp")
    optimizer = fw.build_optimizer(model, "adam")
    hooks = [pf.evaluate_every(4, fw.val_loss, name="val"), pf.save_every(SAVED_AT), pf.best_on("val_loss", mode="min")]
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=hooks,
        max_epochs=MAX_EPOCHS,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=False),
    )
    return model, optimizer, run


def sharded_on_a_store(rank, world, out, *, save_dir, local_dir, tag):
    """On one process group: the whole run (local), the run to step 5 saved sharded on the store, then its resume."""
    model, optimizer, whole = _run(rank, world, local_dir)
    whole.run()
    result = {"whole": fw.full_state(model, optimizer)}
    model, optimizer, partial = _run(rank, world, save_dir)
    partial.run(steps=SAVED_AT)
    partial.ctx.wait_for_save()
    result["saved"] = fw.full_state(model, optimizer)
    partial.ctx.lock.release()  # as when its process ends: the resume below takes the store's lock
    info = latest_checkpoint(storage.location(save_dir) / "model")
    result["checkpoint"] = (info.step, info.path.name, [p.name for p in info.path.iterdir()])
    model, optimizer, resumed = _run(rank, world, save_dir, resume="auto")
    result["restored"] = fw.full_state(model, optimizer)
    resumed.run()
    result["final"] = fw.full_state(model, optimizer)
    _dump(out, tag, rank, result)
