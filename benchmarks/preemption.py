"""What waiting for a preemption signal (and for rank 0's clock) costs per training step.

A tiny DDP workload (a 2-layer MLP, batch 32 per rank, as ``benchmarks/guard.py``)
trains through ``pf.loop`` with its default ``Preemption()`` (SIGTERM held,
asked at every step boundary) and with the boundary check taken out, in
paired rounds (the order alternates), after a warm-up: in one process, and
on 2 gloo ranks, where at each comparison one asynchronous all-reduce of 4
int64 starts and the previous one is read: about once a second by default
(``check_every=None``, rank 0 picks the cadence), or every 10 or every step.

Reported per mode: the time inside the boundary check per step, and the end
to end difference (with minus without), medians of the paired rounds.

    python -m benchmarks.preemption             # writes benchmarks/results/preemption.json
    python -m benchmarks.preemption --quick     # checks that it runs; writes nothing
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

import pimm_fn as pf
from benchmarks._common import free_port, print_table, spread, write_result
from benchmarks.guard import _workload

MODES = {1: (("off", None), ("on", None)), 2: (("off", None), ("on", None), ("on", 10), ("on", 1))}


def _time_steps(model, optimizer, batches, save_dir, mode: str, every: int | None, steps: int) -> tuple:
    """(seconds per step, seconds per step inside the boundary check), the slower rank's."""
    run = pf.loop(
        model,
        optimizer,
        batches,
        hooks=[pf.save_every(10**9)],
        save_dir=save_dir,
        max_epochs=10**6,
        watching=pf.Watching(console=False, progress=False),
        preemption=pf.Preemption(check_every=every),
    )
    stopping, inside = run._walker._stopping, [0.0]
    check = stopping.at_boundary

    def timed(step):
        start = time.perf_counter()
        try:
            return check(step)
        finally:
            inside[0] += time.perf_counter() - start

    stopping.at_boundary = timed
    if mode == "off":
        run._walker._stopping = None
    run.run(steps=5)
    if td.is_initialized():
        td.barrier()
    start = time.perf_counter()
    run.run(steps=steps)
    elapsed = time.perf_counter() - start
    box = torch.tensor([elapsed, inside[0]], dtype=torch.float64)
    if td.is_initialized():
        td.all_reduce(box, op=td.ReduceOp.MAX)
    stopping.settle()
    run.ctx.lock.release()  # the next mode trains into the same save_dir (nothing is ever written there)
    return float(box[0]) / steps, float(box[1]) / steps


def _rank(rank: int, world: int, port: int, args, out: str) -> None:
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        td.init_process_group("gloo", rank=rank, world_size=world)
    model, optimizer, batches = _workload(rank, ddp=world > 1)
    save_dir = os.path.join(os.path.dirname(out), f"never-written-{rank}")
    modes = MODES[world]
    for mode in modes:
        _time_steps(model, optimizer, batches, save_dir, *mode, args.steps // 4)
    rounds = []
    for r in range(args.rounds):
        order = modes if r % 2 == 0 else modes[::-1]
        rounds.append({mode: _time_steps(model, optimizer, batches, save_dir, *mode, args.steps) for mode in order})
    if rank == 0:
        torch.save(rounds, out)
    if world > 1:
        td.destroy_process_group()


def _us(values) -> dict:
    return {k: (v * 1e6 if k != "n" else v) for k, v in spread(values).items()}


def measure(rounds: int = 5, steps: int = 300) -> dict:
    args = argparse.Namespace(rounds=rounds, steps=steps)
    result = {
        "workload": "DDP 2-layer MLP (32-64-1), batch 32 per rank, SGD, torch.set_num_threads(1); 1 process, "
        "and 2 gloo ranks; save_every(10**9) only",
        "rounds": rounds,
        "steps_per_round": steps,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, 2):
            out = os.path.join(tmp, f"rounds-{world}.pt")
            if world == 1:
                _rank(0, 1, 0, args, out)
            else:
                mp.spawn(_rank, args=(world, free_port(), args, out), nprocs=world, join=True)
            paired = torch.load(out)
            off = [r[("off", None)][0] for r in paired]
            for mode in MODES[world][1:]:
                on = [r[mode][0] for r in paired]
                result[f"{world}_rank_check_every_{mode[1] or 'auto'}"] = {
                    "inside_us_per_step": _us([r[mode][1] for r in paired]),
                    "added_us_per_step": _us([b - a for a, b in zip(off, on)]),
                    "step_us_off": _us(off),
                    "step_us_on": _us(on),
                    "overhead_paired_median": statistics.median([(b - a) / a for a, b in zip(off, on)]),
                }
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--quick", action="store_true", help="1 round of 100 steps; writes nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 1, 100
    result = measure(args.rounds, args.steps)
    rows = []
    for name, r in result.items():
        if isinstance(r, dict):
            rows.append(
                [
                    name,
                    f"{r['step_us_off']['median']:.0f}",
                    f"{r['step_us_on']['median']:.0f}",
                    f"{r['inside_us_per_step']['median']:.1f}",
                    f"{r['added_us_per_step']['median']:+.0f}",
                    f"{r['overhead_paired_median']:+.1%}",
                ]
            )
    print_table(
        "preemption check per step",
        ["mode", "step us off", "step us on", "inside check us", "added us", "overhead"],
        rows,
    )
    if not args.quick:
        write_result("preemption", result)


if __name__ == "__main__":
    main()
