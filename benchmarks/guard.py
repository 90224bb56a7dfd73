"""What the run-time agreement guard costs per training step.

Two gloo ranks train a tiny DDP workload (a 2-layer MLP, batch 32 per rank)
through ``pf.loop`` with ``check_agreement=True`` and ``False``, in paired
rounds (the order alternates each round), after a warm-up, with two hook
lists whose cadences never fire, so no effect runs and what is measured is
the guard alone against the cheapest DDP step there is:

* ``builtin``: ``save_every`` and ``log_every``, verified hooks: the guard
  compares the setup once per run and nothing per step;
* ``user``: the same plus a hook of your own listening to ``AfterStep``
  (``events = (AfterStep,)``): one asynchronous all-reduce per step.

    python -m benchmarks.guard                # writes benchmarks/results/guard.json
    python -m benchmarks.guard --rounds 5 --steps 100
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as td
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import pimm_fn as pf
from benchmarks._common import print_table, spread, write_result

MODES = [(hooks, guarded) for hooks in ("builtin", "user") for guarded in (False, True)]


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, batch):
        x, y = batch
        return {"loss": F.mse_loss(self.body(x).squeeze(-1), y)}


def _user_hook(state, event):
    """A hook of your own: the guard watches it."""
    return state, ()


_user_hook.events = (pf.events.AfterStep,)
HOOKS = {
    "builtin": [pf.save_every(10**9), pf.log_every(10**9)],
    "user": [pf.save_every(10**9), pf.log_every(10**9), _user_hook],
}


class _Timed:
    """The guard, with the time spent inside it (waits for answers included) added up."""

    def __init__(self, guard):
        self.guard, self.seconds = guard, 0.0

    def check(self, *args):
        start = time.perf_counter()
        try:
            return self.guard.check(*args)
        finally:
            self.seconds += time.perf_counter() - start

    def __getattr__(self, name):
        return getattr(self.guard, name)


def _time_steps(model, optimizer, batches, hooks: str, guarded: bool, steps: int) -> tuple[float, float]:
    """(seconds per step, seconds per step inside the guard), the slower rank's."""
    run = pf.loop(model, optimizer, batches, hooks=HOOKS[hooks],
                  max_epochs=10**6, check_agreement=guarded, console=False)
    run.run(steps=5)  # warm the loop's caches
    timed = run._interpreter.guard = _Timed(run._interpreter.guard) if guarded else None
    td.barrier()
    start = time.perf_counter()
    run.run(steps=steps)
    elapsed = time.perf_counter() - start
    # Both ranks ran in lockstep (DDP); report the slower one.
    box = torch.tensor([elapsed, timed.seconds if timed else 0.0], dtype=torch.float64)
    td.all_reduce(box, op=td.ReduceOp.MAX)
    return float(box[0]) / steps, float(box[1]) / steps


def _rank(rank: int, world: int, port: int, args, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    td.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_MLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(32, 32, generator=g), torch.randn(32, generator=g)) for _ in range(16)]
    for _ in range(2):  # warm-up of every mode
        for mode in MODES:
            _time_steps(model, optimizer, batches, *mode, args.steps // 4)
    rounds = []
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        rounds.append({mode: _time_steps(model, optimizer, batches, *mode, args.steps) for mode in order})
    if rank == 0:
        torch.save(rounds, out)
    td.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(rounds: int = 7, steps: int = 300) -> dict:
    """Per-step seconds off/on and the relative overhead, over paired rounds."""
    args = argparse.Namespace(rounds=rounds, steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rounds.pt")
        mp.spawn(_rank, args=(2, _free_port(), args, out), nprocs=2, join=True)
        paired = torch.load(out)
    result = {
        "workload": "2 gloo ranks, DDP 2-layer MLP (32-64-1), batch 32 per rank, SGD, torch.set_num_threads(1); "
                    "hooks 'builtin' = save_every + log_every (never firing), 'user' = the same + a hook of "
                    "your own with events=(AfterStep,)",
        "rounds": rounds,
        "steps_per_round": steps,
    }
    for hooks in ("builtin", "user"):
        off = [r[(hooks, False)][0] for r in paired]
        on = [r[(hooks, True)][0] for r in paired]
        inside = [r[(hooks, True)][1] for r in paired]
        overhead = [(b - a) / a for a, b in zip(off, on)]
        result[hooks] = {
            "guard_us_per_step": {k: (v * 1e6 if k != "n" else v) for k, v in spread(inside).items()},
            "guard_share_of_step_off": statistics.median(inside) / statistics.median(off),
            "step_us_guard_off": {k: (v * 1e6 if k != "n" else v) for k, v in spread(off).items()},
            "step_us_guard_on": {k: (v * 1e6 if k != "n" else v) for k, v in spread(on).items()},
            "overhead": {
                "paired_median": statistics.median(overhead),
                "paired_min": min(overhead),
                "of_medians": (statistics.median(on) - statistics.median(off)) / statistics.median(off),
                "of_mins": (min(on) - min(off)) / min(off),
            },
        }
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    result = measure(args.rounds, args.steps)
    rows = []
    for hooks in ("builtin", "user"):
        r = result[hooks]
        off, on, ov = r["step_us_guard_off"], r["step_us_guard_on"], r["overhead"]
        inside = r["guard_us_per_step"]
        rows.append([hooks, f"{off['median']:.0f} / {off['min']:.0f}", f"{on['median']:.0f} / {on['min']:.0f}",
                     f"{ov['paired_median']:+.1%}", f"{ov['of_mins']:+.1%}",
                     f"{inside['median']:.1f} ({r['guard_share_of_step_off']:.1%})"])
    print_table("agreement guard, per DDP step (2 gloo ranks)",
                ["hooks", "off us (median / min)", "on us (median / min)", "paired median", "of mins",
                 "inside guard us (of step)"], rows)
    if not args.no_write:
        print(f"wrote {write_result('guard', result)}")


if __name__ == "__main__":
    main()
