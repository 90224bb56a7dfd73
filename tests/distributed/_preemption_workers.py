"""Workers for preemption on 2 gloo ranks: trained under torchrun and signalled from outside, then resumed.

* under torchrun (``--nproc-per-node=2``)::

      torchrun ... _preemption_workers.py <out_dir> <save_dir>

  trains slowly (DDP, about 15 ms a step), writes ``ready-rank<r>`` (its
  pid) after two steps, and, once a SIGTERM reaches it or its peer, writes
  what it stopped at (``stopped-rank<r>.json``) and exits with the code
  ``pimm_fn.Preempted`` carries;
* ``run_ranks("_preemption_workers:finish", 2, ...)`` resumes each given
  ``save_dir`` to the end and runs the same training uninterrupted beside.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import threading
import time

import torch
import torch.distributed as td

import pimm_fn as pf
from _workers import Net, _dump, _snapshot, loader
from pimm_fn.core import events as ev

MAX_EPOCHS = 6  # 6 steps an epoch on 2 ranks: 36 steps


def build(rank, world, save_dir, resume=None):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    hooks = [pf.evaluate_every(5, _val, name="val"), pf.save_every(4)]
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=hooks,
        max_epochs=MAX_EPOCHS,
        save_dir=save_dir,
        resume=resume,
        parallel=pf.Parallel(ddp=True),
        watching=pf.Watching(console=True, progress=False),
        # compared every 2 steps (by default rank 0 picks about one a second: longer than this whole run)
        preemption=pf.Preemption(check_every=2),
    )
    return model, run


def _val(model):
    from _workers import ValLoss

    return ValLoss()(model)


def _slow(model, ready: pathlib.Path):
    calls = []

    def pause(module, args):
        calls.append(1)
        if len(calls) == 2:
            ready.write_text(str(os.getpid()))
        time.sleep(0.025)  # 34 steps after the second: longer than a signal's delay and the agent's relay

    model.register_forward_pre_hook(pause)


def torchrun_main(out: str, save_dir: str) -> None:
    rank = int(os.environ["RANK"])
    threading.Timer(90, lambda: os._exit(3)).start()  # never outlive the test (torchrun gives us our own session)
    td.init_process_group("gloo")
    model, run = build(rank, td.get_world_size(), save_dir)
    _slow(model, pathlib.Path(out) / f"ready-rank{rank}")
    try:
        run()
        code, stopped = 0, None
    except pf.Preempted as preempted:
        code, stopped = preempted.code, {"step": preempted.step, "reason": preempted.reason}
    (pathlib.Path(out) / f"stopped-rank{rank}.json").write_text(
        json.dumps({"rank": rank, "code": code, "stopped": stopped, "checks": run.ctx.stopping.checks})
    )
    sys.stdout.flush()
    os._exit(code)


def finish(rank, world, out, *, save_dirs, tag):
    """Resume each of ``save_dirs`` to its end, then train the same run uninterrupted: every snapshot."""
    found = {}
    for save_dir in save_dirs:
        _, run = build(rank, world, save_dir, resume="auto")
        resumed_at = run.state.progress.global_step
        run()
        found[save_dir] = {"resumed_at": resumed_at, **_snapshot(run)}
    _, reference = build(rank, world, str(pathlib.Path(out) / f"reference-{rank}-{world}"))
    reference()
    found["reference"] = _snapshot(reference)
    _dump(out, tag, rank, found)


# -- pimm_fn's own process groups once run() ends (test_preemption_ranks) ------------------------------------


def _groups() -> int:
    """The process groups torch holds in this process (the default one included)."""
    return len(td.distributed_c10d._world.pg_map)


def _threads() -> int:
    """This process's threads, the C++ ones included (each gloo group has a loop thread and two workers)."""
    return len(os.listdir("/proc/self/task"))


class _StopAt:
    """A hook that stops training early at ``AfterStep(step)`` (``pf.effects.Stop``), alike on every rank."""

    events = (ev.AfterStep,)

    def __init__(self, step):
        self.step = step

    def __call__(self, state, event):
        return state, ((pf.effects.Stop(event.step, "stop_at"),) if event.step == self.step else ())

    def __repr__(self):
        return f"stop_at({self.step})"


def groups_after_run(rank, world, out, *, save_dir, ending, tag):
    """A run with pimm_fn's own groups (the preemption agreement's, a background save's) that ends ``ending``:
    ``"finished"``, ``"preempted"`` (SIGTERM to rank 1 during step 5), ``"early stop"`` (at step 5) or ``"exception"``
    (a hook raising at step 5 on every rank, then continued to the end): the groups torch holds and this process's
    threads before the run, the most groups during it, and both after each run()."""
    from _workers import _RaiseAt

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    hooks = [
        pf.save_every(3, async_save=True),
        *([_StopAt(5)] if ending == "early stop" else []),
        *([_RaiseAt(5, (0, 1))] if ending == "exception" else []),
    ]
    seen = {"before": (_groups(), _threads()), "during": 0, "after": []}

    def count(module, args):
        seen["during"] = max(seen["during"], _groups())
        if ending == "preempted" and rank == 1 and module.training and len(calls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        calls.append(1)

    calls = []
    model.register_forward_pre_hook(count)
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=hooks,
        max_epochs=2,
        save_dir=save_dir,
        parallel=pf.Parallel(ddp=True),
        watching=pf.Watching(console=False, progress=False),
        preemption=pf.Preemption(check_every=1),
    )
    for _ in range(2):  # an exception leaves run(), which is then continued; the others end at once
        try:
            run()
            ended = "finished" if run.state.stop is None else "early stop"
        except pf.Preempted:
            ended = "preempted"
        except ValueError:
            ended = "exception"
        seen.setdefault("ended", ended)
        seen["after"].append((_groups(), _threads()))
        if ended != "exception":
            break
    seen["finished"] = run.finished
    _dump(out, tag, rank, seen)


if __name__ == "__main__":
    torchrun_main(sys.argv[1], sys.argv[2])
