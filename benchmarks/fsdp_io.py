"""FSDP2 checkpoints: pimm_fn's sharded save and resume load against raw DCP, on 2 gloo ranks.

An MLP of about 100 MB of state (fp32 weights plus Adam's two moments, so a
third is weights; eight 1024x1024 layers by default, ``--width`` for more,
smaller ones) is sharded with ``fully_shard`` on two CPU ranks and takes one
optimizer step. Each paired round then times, on one temp directory of
the same disk, with a barrier before and after every operation (rank 0's
clock):

* **pimm save**: what the loop's save handler does with ``weights_file=False``:
  ``trainer_contents`` (the shards from ``sharded.state``, the replicated and
  per-rank parts) and ``save_checkpoint(..., sharded=shards, weights=None)``
  into a fresh model directory: agreement, DCP, receipts, marker, publish;
* **DCP save**: raw ``dcp.save`` of ``get_state_dict(model, optimizer)`` into
  a fresh directory;
* **pimm save + model.pth**: the same save with ``weights_file=True``: the
  collective ``full_weights`` gather, then rank 0's ``model.pth`` written
  beside DCP;
* **gather**: ``full_weights`` alone;
* **pimm load**: the resume's ``load_checkpoint(info, weights=False)`` and
  ``sharded.load_into``;
* **DCP load**: raw ``dcp.load`` into ``get_state_dict`` templates, then
  ``set_state_dict``.

The order of the saves (and of the loads) alternates from round to round.
The headline figures are pimm / DCP per round (median [min..max]). Loads
read what the page cache holds, for both alike.

Run: ``python -m benchmarks.fsdp_io [--quick]``.
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
import types
import warnings

from benchmarks._common import fmt_spread, print_table, run_ranks, spread, write_result

REPO = pathlib.Path(__file__).resolve().parents[1]
WORLD = 2
SAVES = ("pimm save", "dcp save", "pimm save + model.pth")
LOADS = ("pimm load", "dcp load")


# -- inside each rank -----------------------------------------------------------------------------
def build(mb: float, width: int = 1024):
    """A sharded MLP and its Adam optimizer, one step taken: about ``mb`` MB of state.

    The layers are ``width`` square, each its own ``fully_shard`` unit: fewer,
    larger tensors as ``width`` grows, which leaves pimm_fn's fixed costs
    less per-tensor work of DCP's to hide in.
    """
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    params = int(mb * 1e6 / 12)  # fp32 weights + two fp32 moments
    layers = max(2, round(params / (width * width)))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def state_mb(model, optimizer) -> float:
    """The whole state's size in MB, summed over the ranks' shards; collective."""
    import torch
    import torch.distributed as td
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optim = get_state_dict(model, optimizer)
    local = [v for v in weights.values()] + [v for s in optim["state"].values() for v in s.values()]
    nbytes = sum(_local(v).numel() * v.element_size() for v in local if isinstance(v, torch.Tensor) and v.dim() > 0)
    total = torch.tensor([float(nbytes)])
    td.all_reduce(total)
    return float(total) / 1e6


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _context(model, optimizer):
    """The run's context as the save handler reads it: a sharded model, its optimizer, no scheduler, no hooks."""
    from pimm_fn.core.fold import chain
    from pimm_fn.runtime.engine.implied import Implied
    from pimm_fn.runtime.engine.interpreter import Context

    cursor = {"epoch_start": 0, "generator": None, "samplers": [], "rest": None, "data": "benchmark"}
    return Context(
        model=model,
        optimizer=optimizer,
        feed=types.SimpleNamespace(state_dict=lambda: cursor),
        save_dir=None,
        console=False,
        implied=Implied.of(chain()),
        sharded=True,
    )


def pimm_save(model_dir: pathlib.Path, model, optimizer, weights_file: bool):
    """The save handler's path: ``trainer_contents``, then ``save_checkpoint`` with the shards."""
    from pimm_fn import checkpoint
    from pimm_fn.checkpoint.contents import to_parts
    from pimm_fn.checkpoint.formats import sharded
    from pimm_fn.core.state import Progress, State
    from pimm_fn.runtime.handlers.checkpointing import trainer_contents

    state = State(Progress(iters_per_epoch=10, max_epochs=1, global_step=1, iter_in_epoch=1))
    contents = trainer_contents(_context(model, optimizer), state)
    replicated, local = to_parts(contents)
    weights = sharded.full_weights(model) if weights_file else None
    return checkpoint.save_checkpoint(
        model_dir, step=1, weights=weights, trainer=replicated, local=local, sharded=contents.sharded
    )


def pimm_load(info, model, optimizer) -> None:
    """The resume's path: the trainer parts without the weights file, then the shards into the model."""
    from pimm_fn import checkpoint
    from pimm_fn.checkpoint.contents import from_parts
    from pimm_fn.checkpoint.formats import sharded

    loaded = checkpoint.load_checkpoint(info, weights=False)
    replicated = from_parts(loaded.trainer, loaded.local).replicated
    sharded.load_into(info.path, model, optimizer, replicated.optimizer)


def dcp_save(directory: pathlib.Path, model, optimizer) -> None:
    """Raw DCP: the sharded state dict straight into a fresh directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optim = get_state_dict(model, optimizer)
    dcp.save({"model": weights, "optim": optim}, checkpoint_id=directory)


def dcp_load(directory: pathlib.Path, model, optimizer) -> None:
    """Raw DCP: read into the ``get_state_dict`` templates, then set them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    weights, optim = get_state_dict(model, optimizer)
    state = {"model": weights, "optim": optim}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def gather(model) -> None:
    """The consolidated weights' gather alone (collective)."""
    from pimm_fn.checkpoint.formats import sharded

    sharded.full_weights(model)


def _timed(fn) -> tuple[float, object]:
    """Seconds ``fn`` takes on every rank: a barrier before and after, so no rank's head start counts."""
    import torch.distributed as td

    td.barrier()
    start = time.perf_counter()
    out = fn()
    td.barrier()
    return time.perf_counter() - start, out


def one_round(root: pathlib.Path, model, optimizer, forward: bool, times: dict) -> None:
    """Every save, then every load of what the saves wrote, in ``forward`` or reverse order."""
    saves = {
        "pimm save": lambda: pimm_save(root / "pimm", model, optimizer, False),
        "dcp save": lambda: dcp_save(root / "dcp", model, optimizer),
        "pimm save + model.pth": lambda: pimm_save(root / "pimm-weights", model, optimizer, True),
    }
    info = None
    for name in SAVES if forward else SAVES[::-1]:
        seconds, out = _timed(saves[name])
        times[name].append(seconds)
        info = out if name == "pimm save" else info
    loads = {
        "pimm load": lambda: pimm_load(info, model, optimizer),
        "dcp load": lambda: dcp_load(root / "dcp", model, optimizer),
    }
    for name in LOADS if forward else LOADS[::-1]:
        times[name].append(_timed(loads[name])[0])
    times["gather"].append(_timed(lambda: gather(model))[0])


def check_roundtrip(root: pathlib.Path, model, optimizer) -> None:
    """Refuse to time a load that loads nothing: pimm_fn's load must bring zeroed shards back exactly."""
    import torch

    info = pimm_save(root, model, optimizer, False)
    before = [_local(t).clone() for t in _shards(model, optimizer)]
    with torch.no_grad():
        for t in _shards(model, optimizer):
            _local(t).zero_()
    pimm_load(info, model, optimizer)
    if not all(torch.equal(a, _local(b)) for a, b in zip(before, _shards(model, optimizer))):
        raise RuntimeError("fsdp_io: pimm_fn's load did not restore the saved shards")


def _shards(model, optimizer) -> list:
    """The parameters and Adam's moments (their shards are what a save writes)."""
    moments = [s[k] for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
    return [*model.parameters(), *moments]


def _disk_mb(path: pathlib.Path) -> float:
    """Bytes of every file under ``path``, in MB."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def worker(rank: int, mb: float, width: int, rounds: int, base: pathlib.Path, out: pathlib.Path) -> None:
    """One rank: build, warm up, time ``rounds`` paired rounds; rank 0 writes the seconds to ``out``."""
    import torch.distributed as td

    warnings.filterwarnings("ignore")  # DCP's and FSDP's notices, identical every round
    td.init_process_group("gloo")
    model, optimizer = build(mb, width)
    total_mb = state_mb(model, optimizer)
    times = {name: [] for name in (*SAVES, *LOADS, "gather")}
    one_round(base / "warm", model, optimizer, True, {name: [] for name in times})  # imports, first-call costs
    check_roundtrip(base / "check", model, optimizer)
    sizes = {}
    for r in range(rounds):
        root = base / f"r{r}"
        one_round(root, model, optimizer, r % 2 == 0, times)
        td.barrier()
        if rank == 0:
            sizes = {name: _disk_mb(root / name) for name in ("pimm", "dcp", "pimm-weights")}
            shutil.rmtree(root)
        td.barrier()
    if rank == 0:
        layers = len(model.state_dict())  # bias-free layers: one weight each
        found = {"mb": total_mb, "width": width, "layers": layers, "disk_mb": sizes, "seconds": times}
        out.write_text(json.dumps(found))
    td.destroy_process_group()


# -- the launcher ---------------------------------------------------------------------------------


def launch(mb: float, width: int, rounds: int, timeout: float) -> dict:
    """Run the ranks as fresh processes (one thread each), killed past ``timeout`` seconds; rank 0's figures."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="pimm-fsdp-bench-"))
    args = ["--mb", str(mb), "--width", str(width), "--rounds", str(rounds), "--base", str(base)]
    try:
        run_ranks("benchmarks.fsdp_io", args, base, world=WORLD, timeout=timeout)
        return json.loads((base / "result.json").read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the report -----------------------------------------------------------------------------------
def summarize(raw: dict) -> dict:
    """Spreads of the seconds and the per-round ratios."""
    t = raw["seconds"]
    extra = [w - s for w, s in zip(t["pimm save + model.pth"], t["pimm save"])]
    return {
        "state_mb": raw["mb"],
        "model": f"{raw['layers']} layers of {raw['width']}x{raw['width']}, each sharded",
        "disk_mb": raw["disk_mb"],
        "seconds": {k: spread(v) for k, v in t.items()},
        "save_ratio_vs_dcp": spread(a / b for a, b in zip(t["pimm save"], t["dcp save"])),
        "load_ratio_vs_dcp": spread(a / b for a, b in zip(t["pimm load"], t["dcp load"])),
        "weights_file_extra_s": spread(extra),
        "weights_file_ratio": spread(w / s for w, s in zip(t["pimm save + model.pth"], t["pimm save"])),
        "gather_ratio": spread(g / s for g, s in zip(t["gather"], t["pimm save"])),
    }


def run(quick: bool = False, mb: float = 100, width: int = 1024, rounds: int = 15) -> dict:
    """Measure on 2 ranks, print the table and write ``results/fsdp_io.json``."""
    if quick:
        mb, width, rounds = 2, 128, 2
    before = os.getloadavg()[0]  # other work on the machine disturbs every figure: say how much there was
    size = summarize(launch(mb, width, rounds, timeout=60 if quick else 900))
    result = {
        "quick": quick,
        "world_size": WORLD,
        "rounds": rounds,
        "backend": "gloo (CPU), OMP_NUM_THREADS=1",
        "load_average_1min": {"before": before, "after": os.getloadavg()[0]},
        "size": size,
    }
    table(result)
    write_result("fsdp_io", result)
    return result


def table(result: dict, file=sys.stdout) -> None:
    """The ratios beside the seconds they come from, for the combined report."""
    s = result["size"]
    sec = s["seconds"]
    rows = [
        [
            "save / DCP",
            fmt_spread(s["save_ratio_vs_dcp"], digits=3),
            fmt_spread(sec["pimm save"], "s", 3),
            fmt_spread(sec["dcp save"], "s", 3),
        ],
        [
            "load / DCP",
            fmt_spread(s["load_ratio_vs_dcp"], digits=3),
            fmt_spread(sec["pimm load"], "s", 3),
            fmt_spread(sec["dcp load"], "s", 3),
        ],
        [
            "save + model.pth / save",
            fmt_spread(s["weights_file_ratio"], digits=3),
            fmt_spread(sec["pimm save + model.pth"], "s", 3),
            fmt_spread(sec["pimm save"], "s", 3),
        ],
        [
            "gather alone / save",
            fmt_spread(s["gather_ratio"], digits=3),
            fmt_spread(sec["gather"], "s", 3),
            fmt_spread(sec["pimm save"], "s", 3),
        ],
    ]
    print_table(
        f"FSDP2 checkpoints on {result['world_size']} gloo ranks, {s['state_mb']:.0f} MB of state, "
        f"{s['model']} (per paired round: median [min..max]; model.pth adds {s['weights_file_extra_s']['median']:.3f}s)",
        ["ratio", "value", "numerator", "denominator"],
        rows,
        file=file,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny state, 2 rounds: checks that everything runs")
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--width", type=int, default=1024, help="the layers' width: fewer, larger tensors as it grows")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # set by launch() for its ranks
    parser.add_argument("--base", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        worker(args.rank, args.mb, args.width, args.rounds, args.base, args.base / "result.json")
    else:
        run(quick=args.quick, mb=args.mb, width=args.width, rounds=args.rounds)


if __name__ == "__main__":
    main()
