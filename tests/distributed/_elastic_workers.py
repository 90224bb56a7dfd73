"""Workers for runs on several (simulated) nodes: elastic restarts and node-local storage.

Two ways in:

* ``run_ranks("_elastic_workers:<function>", ...)`` (see ``_launch``), like
  every worker beside ``_workers``;
* torchrun, one agent per simulated node::

      torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d ... \\
          _elastic_workers.py <function> <out_dir> <json kwargs>

  rank and world size come from torchrun's environment; a watchdog ends the
  process at ``PIMM_TEST_DEADLINE`` (seconds since the epoch), since torchrun
  starts each worker in a session of its own, out of reach of the test's kill.

``KINDS`` names how a model is built and handed to the loop (``"ddp"``);
another kind (a sharded model) is one more entry.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import pathlib
import signal
import socket
import sys
import threading
import time
import traceback

import torch
import torch.distributed as td

import pimm_fn as pf
from _workers import MAX_EPOCHS, Net, _dump, _snapshot, hooks_for, loader
from pimm_fn.checkpoint import latest_checkpoint, save_checkpoint, save_checkpoint_async


def _ddp():
    """A replicated model the loop wraps in DistributedDataParallel."""
    torch.manual_seed(0)
    model = Net()
    return model, torch.optim.AdamW(model.parameters(), lr=0.01), {"parallel": pf.Parallel(ddp=True)}


def _fsdp():
    """A sharded model (FSDP2), handed to the loop as it is."""
    from _fsdp_workers import build_model

    model = build_model("fsdp")
    return model, torch.optim.AdamW(model.parameters(), lr=0.01), {}


# kind -> () -> (model, optimizer, extra loop() arguments); the same on every rank and every restart.
KINDS = {"ddp": _ddp, "fsdp": _fsdp}


def _state(run, kind) -> dict:
    """What the test compares; a sharded model's gathered (collective), once its optimizer has state to gather."""
    if kind != "fsdp":
        return _snapshot(run)
    from _fsdp_workers import full_state

    found = {"progress": run.state.progress, "best": dict(run.state.best)}
    if run.ctx.optimizer.state:  # gathering a fresh optimizer's state would create it (a zero step)
        found.update(full_state(run.ctx.model, run.ctx.optimizer))
    return found


def train(rank, world, out, *, kind, save_dir, tag, kill_after=None, kill_rank=1, marker=None):
    """Train the tiny run with ``resume="auto"``; rank ``kill_rank`` SIGKILLs itself after ``kill_after`` steps, once."""
    model, optimizer, extra = KINDS[kind]()
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=hooks_for("standard"),
        max_epochs=MAX_EPOCHS,
        save_dir=save_dir,
        resume="auto",
        watching=pf.Watching(console=False),
        **extra,
    )
    result = {
        "rank": rank,
        "world": world,
        "restored": _state(run, kind),
        "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    }
    if kill_after is not None and rank == kill_rank and not pathlib.Path(marker).exists():
        run.run(steps=kill_after)
        pathlib.Path(marker).write_text(f"rank {rank} killed after step {run.state.progress.global_step}\n")
        print(f"rank {rank} kills itself after step {run.state.progress.global_step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    run.run()
    result["final"] = _state(run, kind)
    result["trace"] = run.trace
    _dump(out, tag, rank, result)


def _outcome(save) -> tuple | None:
    """``None`` when ``save()`` succeeded, else the error's type name and message."""
    try:
        save()
        return None
    except Exception as exc:  # noqa: BLE001 - recorded for the test to check
        return type(exc).__name__, str(exc)


def node_local(rank, world, out, *, nodes, tag):
    """Each rank works in ``nodes[rank]``, as on a node of its own, and saves into the relative ``run``.

    The same path on two nodes' own disks: rank 0's ``run`` is ``nodes[0]/run``,
    rank 1's is ``nodes[1]/run``. First every rank saves step 1 (in the
    background) into rank 0's directory by its absolute path (a checkpoint
    on shared storage), then steps 2 (sync) and 3 (async) into ``run``, and
    a loop makes its first save into ``loop``.
    """
    os.chdir(nodes[rank])
    weights, trainer, local = {"w": torch.ones(3)}, {"lr": 0.1}, {"rank": rank}
    shared = pathlib.Path(nodes[0]) / "run" / "model"
    save_checkpoint_async(shared, step=1, weights=weights, trainer=trainer, local=local).wait()
    result = {"rank": rank, "host": socket.gethostname()}
    result["sync"] = _outcome(
        lambda: save_checkpoint("run/model", step=2, weights=weights, trainer=trainer, local=local)
    )
    result["async"] = _outcome(
        lambda: save_checkpoint_async("run/model", step=3, weights=weights, trainer=trainer, local=local).wait()
    )
    model, optimizer, extra = _ddp()
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=[pf.save_every(4)],
        max_epochs=1,
        save_dir="loop",
        watching=pf.Watching(console=False),
        **extra,
    )
    result["loop"] = _outcome(run.run)
    result["loop_step"] = run.state.progress.global_step
    result["latest"] = [getattr(latest_checkpoint(d), "step", None) for d in ("run/model", "loop/model")]
    _dump(out, tag, rank, result)


def _watchdog() -> None:
    """End this process at ``PIMM_TEST_DEADLINE``, so a hung worker never outlives its test."""
    deadline = float(os.environ.get("PIMM_TEST_DEADLINE", "inf"))

    def expire():
        print(f"worker {os.getpid()} passed its deadline: exiting; where its threads were:", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(124)

    if deadline != float("inf"):
        threading.Timer(max(deadline - time.time(), 0.0), expire).start()


def main(argv) -> int:
    """Under torchrun: ``<function> <out_dir> <json kwargs>``; rank and world size from the environment."""
    _watchdog()
    function, out, kwargs = argv[1], argv[2], json.loads(argv[3])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    td.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    try:
        globals()[function](rank, world, out, **kwargs)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # no destroy: a peer may be gone
    td.barrier()
    td.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
