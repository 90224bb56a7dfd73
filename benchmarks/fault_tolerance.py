"""The per-step cost of fault tolerance: a torchft quorum and commit vote a step, against plain DDP, on 2 processes.

Two processes of this machine, one torch thread each. Each builds two
runs of the same ``loop`` over an MLP of 512-wide layers (SGD, no hooks,
no ``save_dir``): **ft**, its own replica group under
``Parallel(fault_tolerant=FaultTolerance(min_replicas=2))`` against a
lighthouse the launcher holds, and **ddp**, the two processes as the ranks
of one gloo group under ``Parallel(ddp=True)`` (built after the first,
which is a group of one). Both average the same gradients over the two
processes; ft adds a quorum at each step's boundary and the commit vote.
Each round (the order rotating), after a barrier, trains ``steps`` steps
of each, and of ft again with its groups' comparison at the vote switched
off (**ft unchecked**: ``pimm_fn.runtime.replicas.agreement``, off on both
groups for that part); the figures are per step: ft - ddp, ft / ddp and
ft - ft unchecked per round (median [min..max]), and where ft's extra time
goes (the quorum, ``should_commit``, the all-reduce of the gradients, timed
inside ft).

Run: ``python -m benchmarks.fault_tolerance [--quick]`` (needs torchft:
``pip install 'pimm_fn[ft]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as td
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf
from benchmarks._common import fmt_spread, print_table, run_ranks, spread, write_result
from pimm_fn.runtime.replicas import commit

WORLD = 2
WIDTH = 512
LAYERS = (1, 8)  # 1 MB and 8.4 MB of parameters: the quorum's fixed cost against a step that grows


class Regression(torch.nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.net = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))

    def forward(self, batch):
        x, y = batch
        return {"loss": F.mse_loss(self.net(x), y)}


def build(layers: int, total: int, parallel) -> pf.Loop:
    torch.manual_seed(0)
    model = Regression(layers)
    data = TensorDataset(torch.randn(256, WIDTH), torch.randn(256, WIDTH))
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=1e-3),
        DataLoader(data, batch_size=8),
        max_steps=total,
        parallel=parallel,
        watching=pf.Watching(console=False, progress=False, sanity_check=0),
    )


class Timed:
    """Seconds spent in a function, summed: wraps it where it is looked up."""

    def __init__(self, owner, name: str):
        self.seconds, inner = 0.0, getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(owner, name, timed)


# -- inside each rank -----------------------------------------------------------------------------
def worker(rank: int, layers: int, steps: int, rounds: int, lighthouse: str, base: pathlib.Path) -> None:
    torch.set_num_threads(1)
    total = (2 * rounds + 1) * steps  # ft trains its rounds, checked and unchecked
    tolerance = pf.FaultTolerance(min_replicas=WORLD, lighthouse=lighthouse, replica_group=str(rank), timeout=60)
    ft = build(layers, total, pf.Parallel(fault_tolerant=tolerance))  # before the default group: a group of one
    td.init_process_group("gloo", rank=rank, world_size=WORLD)
    ddp = build(layers, total, pf.Parallel(ddp=True))
    replicas = ft.ctx.replicas
    quorum = Timed(replicas, "at_boundary")
    voting = Timed(commit, "vote")
    should = Timed(replicas.manager, "should_commit")
    agreement = replicas.agreement
    starting, judging = Timed(agreement, "start"), Timed(agreement, "judge")  # inside the quorum's and vote's time
    runs = {"ddp": ddp, "ft": ft, "ft_unchecked": ft}
    for run in (ddp, ft):  # warm-up: the groups' connections, first calls
        td.barrier()
        run.run(steps)
    times: dict[str, list[float]] = {name: [] for name in runs}
    parts: dict[str, list[float]] = {
        "quorum": [],
        "should_commit": [],
        "allreduce": [],
        "agree_start": [],
        "agree_judge": [],
    }
    for r in range(rounds):
        names = list(runs)
        for name in names[r % 3 :] + names[: r % 3]:
            replicas.agreement = None if name == "ft_unchecked" else agreement  # alike on both groups
            td.barrier()
            before = (quorum.seconds, voting.seconds, should.seconds, starting.seconds, judging.seconds)
            start = time.perf_counter()
            runs[name].run(steps)
            times[name].append((time.perf_counter() - start) / steps)
            if name == "ft":
                now = (quorum.seconds, voting.seconds, should.seconds, starting.seconds, judging.seconds)
                q, v, s, a, j = (later - then for later, then in zip(now, before))
                parts["quorum"].append((q - a) / steps)  # the agreement's start is timed inside the quorum's
                parts["agree_start"].append(a / steps)
                parts["agree_judge"].append(j / steps)
                parts["should_commit"].append(s / steps)
                parts["allreduce"].append((v - s) / steps)
    replicas.agreement = agreement
    if rank == 0:
        weights = sum(p.numel() * p.element_size() for p in ddp.ctx.model.parameters())
        (base / "result.json").write_text(json.dumps({"parameters_mb": weights / 1e6, "step_s": times, "ft": parts}))
    td.barrier()
    replicas.close()
    td.destroy_process_group()


# -- the launcher ---------------------------------------------------------------------------------
def launch(layers: int, steps: int, rounds: int, timeout: float) -> dict:
    os.environ.setdefault("RUST_LOG", "error")  # the lighthouse and managers log every quorum otherwise
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=WORLD, join_timeout_ms=1000)
    base = pathlib.Path(tempfile.mkdtemp(prefix="pimm-ft-bench-"))
    try:
        args = ["--layers", str(layers), "--steps", str(steps), "--rounds", str(rounds)]
        run_ranks(
            "benchmarks.fault_tolerance",
            [*args, "--lighthouse", lighthouse.address(), "--base", str(base)],
            base,
            world=WORLD,
            timeout=timeout,
        )
        return json.loads((base / "result.json").read_text())
    finally:
        lighthouse.shutdown()
        shutil.rmtree(base, ignore_errors=True)


def summarize(raw: dict) -> dict:
    t = raw["step_s"]
    return {
        "parameters_mb": raw["parameters_mb"],
        "step_ms": {k: spread(1e3 * s for s in v) for k, v in t.items()},
        "ft_minus_ddp_ms": spread(1e3 * (f - d) for f, d in zip(t["ft"], t["ddp"])),
        "ft_over_ddp": spread(f / d for f, d in zip(t["ft"], t["ddp"])),
        "agreement_ms": spread(1e3 * (f - u) for f, u in zip(t["ft"], t["ft_unchecked"])),
        "ft_parts_ms": {k: spread(1e3 * s for s in v) for k, v in raw["ft"].items()},
    }


def run(quick: bool = False, sizes=LAYERS, steps: int = 40, rounds: int = 7) -> dict:
    """Measure each size on 2 processes, print the table and write ``results/fault_tolerance.json``."""
    if quick:
        sizes, steps, rounds = (1,), 5, 2
    before = os.getloadavg()[0]
    found = {f"{n} layers": summarize(launch(n, steps, rounds, timeout=120 if quick else 900)) for n in sizes}
    result = {
        "quick": quick,
        "world_size": WORLD,
        "steps_per_round": steps,
        "rounds": rounds,
        "backend": "gloo (CPU), OMP_NUM_THREADS=1; ft: torchft 0.2.0, a lighthouse in the launcher",
        "load_average_1min": {"before": before, "after": os.getloadavg()[0]},
        "sizes": found,
    }
    table(result)
    write_result("fault_tolerance", result)
    return result


def table(result: dict, file=sys.stdout) -> None:
    rows = [
        [
            f"{s['parameters_mb']:.2f} MB",
            fmt_spread(s["step_ms"]["ddp"], " ms", 2),
            fmt_spread(s["step_ms"]["ft"], " ms", 2),
            fmt_spread(s["ft_minus_ddp_ms"], " ms", 2),
            fmt_spread(s["ft_over_ddp"], digits=2),
            fmt_spread(s["agreement_ms"], " ms", 2),
            " · ".join(f"{k} {v['median']:.2f}" for k, v in s["ft_parts_ms"].items()),
        ]
        for s in result["sizes"].values()
    ]
    print_table(
        f"A fault-tolerant step against a DDP step on {result['world_size']} gloo processes (per step; per paired "
        f"round: median [min..max])",
        [
            "parameters",
            "ddp step",
            "ft step",
            "ft - ddp",
            "ft / ddp",
            "ft - ft unchecked",
            "in ft, ms: quorum · should_commit · all-reduce · agreement (start, judge)",
        ],
        rows,
        file=file,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small model, 2 rounds: checks that everything runs")
    parser.add_argument("--layers", type=int, nargs="*", default=list(LAYERS), help="512-wide layers, one run each")
    parser.add_argument("--steps", type=int, default=40, help="steps of each run a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # set by launch() for its ranks
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    parser.add_argument("--base", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        worker(args.rank, args.layers[0], args.steps, args.rounds, args.lighthouse, args.base)
    else:
        run(quick=args.quick, sizes=tuple(args.layers), steps=args.steps, rounds=args.rounds)


if __name__ == "__main__":
    main()
