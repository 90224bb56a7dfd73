"""What the run-time agreement guard costs per training step.

Two gloo ranks train a tiny DDP workload (a 2-layer MLP, batch 32 per rank)
through ``pf.loop`` with ``Parallel(check_agreement=True)`` and ``False``, in paired
rounds (the order alternates each round), after a warm-up, with three hook
lists whose built-in cadences never fire, so no effect runs and what is
measured is the guard alone against the cheapest DDP step there is:

* ``builtin``: ``save_every`` and ``log_every``, rank-consistent hooks: the
  guard compares the setup once per run and nothing per step;
* ``user_every_1``: the same plus a hook of your own (not rank-consistent)
  called at every step: one asynchronous all-reduce per step;
* ``user_every_100``: the same hook declaring ``every = 100``: one
  all-reduce per 100 steps.

Reported per hook list: the time spent inside the guard per step, and the
end-to-end cost (guarded step minus unguarded step, in us and as a ratio of
the unguarded step), as medians of the paired rounds of one process run.

    python -m benchmarks.guard                # writes benchmarks/results/guard.json
    python -m benchmarks.guard --rounds 5 --steps 100
    python -m benchmarks.guard --quick        # checks that it runs; writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as td
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import pimm_fn as pf
from benchmarks._common import free_port, print_table, spread, write_result

HOOK_LISTS = ("builtin", "user_every_1", "user_every_100")
MODES = [(hooks, guarded) for hooks in HOOK_LISTS for guarded in (False, True)]


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, batch):
        x, y = batch
        return {"loss": F.mse_loss(self.body(x).squeeze(-1), y)}


class _UserHook:
    """A hook of your own, called on ``AfterStep`` every ``every`` steps: the guard watches it."""

    events = (pf.events.AfterStep,)

    def __init__(self, every: int):
        self.every = every

    def __call__(self, state, event):
        return state, ()

    def __repr__(self):
        return f"user_hook(every={self.every})"


def _hooks(name: str) -> list:
    builtin = [pf.save_every(10**9), pf.log_every(10**9)]
    if name == "builtin":
        return builtin
    return builtin + [_UserHook(int(name.rsplit("_", 1)[1]))]


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


def _time_steps(model, optimizer, batches, save_dir, hooks: str, guarded: bool, steps: int) -> tuple[float, float]:
    """(seconds per step, seconds per step inside the guard), the slower rank's."""
    run = pf.loop(
        model,
        optimizer,
        batches,
        hooks=_hooks(hooks),
        save_dir=save_dir,
        max_epochs=10**6,
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(check_agreement=guarded),
    )
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


def _workload(rank: int, ddp: bool) -> tuple:
    """The seeded MLP (DDP-wrapped with ``ddp``), its SGD and 16 batches of 32 drawn from seed ``rank``."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_MLP()) if ddp else _MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(32, 32, generator=g), torch.randn(32, generator=g)) for _ in range(16)]
    return model, optimizer, batches


def _rank(rank: int, world: int, port: int, args, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    td.init_process_group("gloo", rank=rank, world_size=world)
    model, optimizer, batches = _workload(rank, ddp=True)
    save_dir = os.path.join(os.path.dirname(out), "never-written")  # the save hooks never fire
    for _ in range(2):  # warm-up of every mode
        for mode in MODES:
            _time_steps(model, optimizer, batches, save_dir, *mode, args.steps // 4)
    rounds = []
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        rounds.append({mode: _time_steps(model, optimizer, batches, save_dir, *mode, args.steps) for mode in order})
    if rank == 0:
        torch.save(rounds, out)
    td.destroy_process_group()


def measure(rounds: int = 7, steps: int = 300) -> dict:
    """Per-step seconds off/on and the relative overhead, over paired rounds."""
    args = argparse.Namespace(rounds=rounds, steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rounds.pt")
        mp.spawn(_rank, args=(2, free_port(), args, out), nprocs=2, join=True)
        paired = torch.load(out)
    result = {
        "workload": "2 gloo ranks, DDP 2-layer MLP (32-64-1), batch 32 per rank, SGD, torch.set_num_threads(1); "
        "hooks 'builtin' = save_every + log_every (never firing), 'user_every_1' / 'user_every_100' = "
        "the same + a hook of your own (not rank_consistent) with events=(AfterStep,), every=1 / 100",
        "rounds": rounds,
        "steps_per_round": steps,
    }
    for hooks in HOOK_LISTS:
        result[hooks] = _summary([r[(hooks, False)] for r in paired], [r[(hooks, True)] for r in paired])
    return result


def _us(values) -> dict:
    return {k: (v * 1e6 if k != "n" else v) for k, v in spread(values).items()}


def _summary(off_rounds, on_rounds) -> dict:
    """One hook list's figures from its paired rounds: (step seconds, inside-guard seconds) off and on."""
    off = [r[0] for r in off_rounds]
    on = [r[0] for r in on_rounds]
    inside = [r[1] for r in on_rounds]
    added = [b - a for a, b in zip(off, on)]
    return {
        "guard_us_per_step": _us(inside),
        "guard_share_of_step_off": statistics.median(inside) / statistics.median(off),
        "added_us_per_step": _us(added),
        "step_us_guard_off": _us(off),
        "step_us_guard_on": _us(on),
        "overhead": {
            "paired_median": statistics.median([d / a for d, a in zip(added, off)]),
            "paired_min": min(d / a for d, a in zip(added, off)),
            "of_medians": (statistics.median(on) - statistics.median(off)) / statistics.median(off),
            "of_mins": (min(on) - min(off)) / min(off),
        },
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--quick", action="store_true", help="1 round of 100 steps; writes nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.no_write = 1, 100, True
    result = measure(args.rounds, args.steps)
    rows = []
    for hooks in HOOK_LISTS:
        r = result[hooks]
        off, on, ov = r["step_us_guard_off"], r["step_us_guard_on"], r["overhead"]
        inside, added = r["guard_us_per_step"], r["added_us_per_step"]
        rows.append(
            [
                hooks,
                f"{off['median']:.0f} / {off['min']:.0f}",
                f"{on['median']:.0f} / {on['min']:.0f}",
                f"{added['median']:+.0f}",
                f"{ov['paired_median']:+.1%}",
                f"{ov['of_mins']:+.1%}",
                f"{inside['median']:.1f} ({r['guard_share_of_step_off']:.1%})",
            ]
        )
    print_table(
        "agreement guard, per DDP step (2 gloo ranks)",
        [
            "hooks",
            "off us (median / min)",
            "on us (median / min)",
            "added us (paired median)",
            "paired median",
            "of mins",
            "inside guard us (of step)",
        ],
        rows,
    )
    if not args.no_write:
        print(f"wrote {write_result('guard', result)}")


if __name__ == "__main__":
    main()
