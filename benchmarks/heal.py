"""Healing a replica from a live peer: its time against the state's size, on 2 gloo ranks of this machine.

Each rank is a run of its own (no default process group, as torchft's
replica groups are), joined by a gloo group made apart from it. Both build
the same ``loop`` over an MLP of 512-wide layers with Adam, about ``mb`` MB
of parameters (so three times that of state: the weights and Adam's two
moments), and train 2 steps. Then each paired round times, on the
receiver's clock, after a barrier:

* **heal**: ``send_state`` on rank 0, ``receive_state`` on rank 1: the JSON
  document, the receiver's checks, every tensor, the restore into its run
  (optimizer, weights, scheduler, RNG, data cursor, ``State``) and the answers;
* **raw**: the same tensors alone, one ``send``/``recv`` each into buffers
  made ahead, nothing checked or loaded: the floor any transfer of this
  state pays on this group.

The order alternates from round to round. The headline figure is heal /
raw per round (median [min..max]), beside the seconds and what was sent.

Run: ``python -m benchmarks.heal [--quick]``.
"""

from __future__ import annotations

import argparse
import datetime
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
from pimm_fn.checkpoint.contents import to_parts
from pimm_fn.checkpoint.formats.pack import pack
from pimm_fn.runtime.handlers.checkpointing import trainer_contents
from pimm_fn.runtime.replicas import heal

REPO = pathlib.Path(__file__).resolve().parents[1]
WORLD = 2
WIDTH = 512
SIZES = (10, 100)  # MB of parameters


# -- inside each rank -----------------------------------------------------------------------------
def build(mb: float, save_dir: pathlib.Path):
    """A run of about ``mb`` MB of parameters, 2 steps trained: Adam's moments exist, as in any live run."""
    torch.manual_seed(0)
    layers = max(1, round(mb * 1e6 / 4 / (WIDTH * WIDTH + WIDTH)))
    net = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    model = Regression(net)
    data = TensorDataset(torch.randn(64, WIDTH), torch.randn(64, WIDTH))
    run = pf.loop(
        model,
        torch.optim.Adam(model.parameters(), lr=1e-4),
        DataLoader(data, batch_size=4, shuffle=True),
        hooks=[pf.save_every(1000)],
        max_epochs=1,
        save_dir=save_dir,
        watching=pf.Watching(console=False, progress=False),
    )
    run.run(2)
    return run


class Regression(torch.nn.Module):
    """The MLP's mean squared error as its loss, as the default step wants it."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, batch):
        x, y = batch
        return {"loss": F.mse_loss(self.net(x), y)}


def _raw(run, group, rank: int, buffers) -> None:
    """The state's tensors alone, one send/recv each: rank 0 sends its own, rank 1 receives into ``buffers``."""
    for tensor in _tensors(run) if rank == 0 else buffers:
        (group.send if rank == 0 else group.recv)([tensor], 1 - rank, 0).wait()


def _tensors(run) -> list:
    """What a heal sends of this run, as tensors: the weights, the optimizer's, the RNG states and cursor's."""
    trainer, local = to_parts(trainer_contents(run.ctx, run.state, agree=False))
    _, found = pack({"weights": run.ctx.weights(), "trainer": trainer, "local": local})
    return [found[str(i)].contiguous() for i in range(len(found)) if found[str(i)].numel()]


def worker(rank: int, mb: float, rounds: int, base: pathlib.Path) -> None:
    """One rank: build, warm up, check the round trip, time ``rounds`` paired rounds; rank 1 writes the seconds."""
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=300)
    store = td.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD, rank == 0, timeout=timeout)
    group = td.ProcessGroupGloo(store, rank, WORLD, timeout)
    run = build(mb, base / f"run{rank}")
    buffers = [torch.empty_like(t) for t in _tensors(run)]
    steps = {
        "heal": lambda: heal.send_state(run, 1, group) if rank == 0 else heal.receive_state(run, 0, group),
        "raw": lambda: _raw(run, group, rank, buffers),
    }
    for name in steps:  # warm-up: first-call costs, the connection's buffers
        steps[name]()
    if rank == 1 and not all(torch.equal(a, b) for a, b in zip(buffers, _tensors(run))):
        raise RuntimeError("heal: the healed run does not hold what the raw transfer received")
    times: dict[str, list[float]] = {name: [] for name in steps}
    healed = None
    for r in range(rounds):
        for name in steps if r % 2 == 0 else list(steps)[::-1]:
            group.barrier().wait()
            start = time.perf_counter()
            out = steps[name]()
            times[name].append(time.perf_counter() - start)
            healed = out if name == "heal" else healed
    if rank == 1:
        weights = sum(t.numel() * t.element_size() for t in run.ctx.weights().values())
        found = {
            "parameters_mb": weights / 1e6,
            "layers": len(run.ctx.weights()) // 2,
            "json_bytes": healed.json_bytes,
            "tensors": healed.tensors,
            "tensor_mb": healed.tensor_bytes / 1e6,
            "seconds": times,
        }
        (base / "result.json").write_text(json.dumps(found))
    group.barrier().wait()  # rank 0 hosts the store: it stays until rank 1 is done with it


# -- the launcher ---------------------------------------------------------------------------------
def launch(mb: float, rounds: int, timeout: float) -> dict:
    """Run the ranks as fresh processes (one thread each), killed past ``timeout`` seconds; rank 1's figures."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="pimm-heal-bench-"))
    try:
        run_ranks(
            "benchmarks.heal",
            ["--mb", str(mb), "--rounds", str(rounds), "--base", str(base)],
            base,
            world=WORLD,
            timeout=timeout,
        )
        return json.loads((base / "result.json").read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the report -----------------------------------------------------------------------------------
def summarize(raw: dict) -> dict:
    """Spreads of the seconds and the per-round ratio, with what was sent."""
    t = raw["seconds"]
    return {
        **{k: raw[k] for k in ("parameters_mb", "layers", "json_bytes", "tensors", "tensor_mb")},
        "seconds": {k: spread(v) for k, v in t.items()},
        "heal_ratio_vs_raw": spread(h / r for h, r in zip(t["heal"], t["raw"])),
        "heal_mb_per_s": spread(raw["tensor_mb"] / h for h in t["heal"]),
    }


def run(quick: bool = False, sizes=SIZES, rounds: int = 7) -> dict:
    """Measure each size on 2 ranks, print the table and write ``results/heal.json``."""
    if quick:
        sizes, rounds = (1,), 2
    before = os.getloadavg()[0]  # other work on the machine disturbs every figure: say how much there was
    found = {f"{mb} MB": summarize(launch(mb, rounds, timeout=60 if quick else 900)) for mb in sizes}
    result = {
        "quick": quick,
        "world_size": WORLD,
        "rounds": rounds,
        "backend": "gloo (CPU), a group apart from the default one, OMP_NUM_THREADS=1",
        "load_average_1min": {"before": before, "after": os.getloadavg()[0]},
        "sizes": found,
    }
    table(result)
    write_result("heal", result)
    return result


def table(result: dict, file=sys.stdout) -> None:
    """One row per size: what was sent, heal and raw seconds, their ratio."""
    rows = [
        [
            f"{s['parameters_mb']:.1f} MB",
            f"{s['tensors']} · {s['tensor_mb']:.1f} MB · {s['json_bytes'] / 1024:.1f} KB",
            fmt_spread(s["seconds"]["heal"], "s", 3),
            fmt_spread(s["seconds"]["raw"], "s", 3),
            fmt_spread(s["heal_ratio_vs_raw"], digits=2),
            f"{s['heal_mb_per_s']['median']:.0f} MB/s",
        ]
        for s in result["sizes"].values()
    ]
    print_table(
        f"Healing a replica on {result['world_size']} gloo ranks (per paired round: median [min..max])",
        ["parameters", "tensors · MB · JSON", "heal", "raw tensors", "heal / raw", "heal rate"],
        rows,
        file=file,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny state, 2 rounds: checks that everything runs")
    parser.add_argument("--mb", type=float, nargs="*", default=list(SIZES), help="MB of parameters, one run each")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # set by launch() for its ranks
    parser.add_argument("--base", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        worker(args.rank, args.mb[0], args.rounds, args.base)
    else:
        run(quick=args.quick, sizes=tuple(args.mb), rounds=args.rounds)


if __name__ == "__main__":
    main()
