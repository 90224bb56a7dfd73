"""Checkpoint throughput: pimm_fn's standard format against raw DCP, torch.save and the disk.

For states of about 10, 100 and 500 MB (an MLP's weights plus Adam's two
moments, so a third is weights), each paired round times, on one temp
directory of the same disk:

* pimm_fn ``save_checkpoint`` / ``load_checkpoint`` (standard format: the
  weights file, the DCP trainer directory, the marker and the atomic publish);
* raw ``torch.distributed.checkpoint.save`` / ``load`` of the same state;
* ``torch.save`` / ``torch.load`` of the same state into one file, fsynced;
* ``dd`` writing the same number of bytes with ``conv=fdatasync``: the disk's
  own write bandwidth, the physical limit.

The headline ratios are pimm_fn / raw DCP, per round (min/median/max). Loads
read what the page cache holds, for every row alike.

Run: ``python -m benchmarks.checkpoint_io [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

from benchmarks._common import fmt_spread, print_table, spread, write_result

SIZES_MB = (10, 100, 500)


def make_state(mb: float):
    """A model and an Adam optimizer (one step taken) whose state is about ``mb`` MB."""
    import torch

    torch.manual_seed(0)
    params = int(mb * 1e6 / 12)  # fp32 weights + two fp32 moments
    width = 1024 if params >= 8 * 1024 * 1024 else 256
    layers = max(1, params // (width * width))
    rest = max(1, (params - layers * width * width) // width)
    blocks = [torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
    blocks.append(torch.nn.Linear(width, rest, bias=False))
    model = torch.nn.Sequential(*blocks)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt


def state_bytes(model, opt) -> int:
    import torch

    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for s in opt.state_dict()["state"].values():
        total += sum(v.numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor))
    return total


def _fsync_tree(path: pathlib.Path) -> None:
    for f in [path] if path.is_file() else path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def pimm_save(root, model, opt):
    from pimm_fn import checkpoint

    return checkpoint.save_checkpoint(
        root / "model", step=1, weights=model.state_dict(), trainer={"optimizer": opt.state_dict()}, local={}
    )


def pimm_load(info):
    from pimm_fn import checkpoint

    return checkpoint.load_checkpoint(info)


def dcp_save(root, model, opt):
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=root / "dcp")


def dcp_load(root, model, opt):
    import torch
    import torch.distributed.checkpoint as dcp

    template = {
        "model": {k: torch.empty_like(v) for k, v in model.state_dict().items()},
        "optim": _empty_like_optim(opt.state_dict()),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(template, checkpoint_id=root / "dcp")
    return template


def _empty_like_optim(sd):
    import torch

    return {
        "state": {
            k: {n: torch.empty_like(v) if isinstance(v, torch.Tensor) else v for n, v in s.items()}
            for k, s in sd["state"].items()
        },
        "param_groups": sd["param_groups"],
    }


def torch_save(root, model, opt):
    import torch

    path = root / "state.pt"
    with open(path, "wb") as f:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())


def torch_load(root):
    import torch

    return torch.load(root / "state.pt", map_location="cpu", weights_only=True)


def dd_write(root, nbytes: int) -> float:
    """Seconds ``dd`` takes to write ``nbytes`` with fdatasync (falls back to Python)."""
    path = root / "dd.bin"
    count = max(1, nbytes // 2**20)
    dd = shutil.which("dd")
    if dd:
        t = time.perf_counter()
        subprocess.run(
            [dd, "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}", "conv=fdatasync"],
            check=True,
            capture_output=True,
        )
        dt = time.perf_counter() - t
    else:
        block = b"\0" * 2**20
        t = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(count):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        dt = time.perf_counter() - t
    path.unlink()
    return dt * nbytes / (count * 2**20)


def measure(mb: float, rounds: int) -> dict:
    """Paired rounds of every save and load at one size; seconds per round."""
    model, opt = make_state(mb)
    nbytes = state_bytes(model, opt)
    times = {k: [] for k in ("pimm save", "pimm load", "dcp save", "dcp load", "torch.save", "torch.load", "dd write")}
    base = pathlib.Path(tempfile.mkdtemp(prefix="pimm-ckpt-bench-"))
    try:
        warm = base / "warm"
        warm.mkdir()
        pimm_load(pimm_save(warm, model, opt))  # warm-up: imports and first-call costs
        dcp_save(warm, model, opt)
        dcp_load(warm, model, opt)
        shutil.rmtree(warm)
        for r in range(rounds):
            root = base / f"r{r}"
            root.mkdir()
            order = [0, 1, 2] if r % 2 == 0 else [2, 1, 0]
            for i in order:
                if i == 0:
                    dt, info = _timed(lambda: pimm_save(root, model, opt))
                    times["pimm save"].append(dt)
                    times["pimm load"].append(_timed(lambda: pimm_load(info))[0])
                elif i == 1:
                    times["dcp save"].append(_timed(lambda: dcp_save(root, model, opt))[0])
                    times["dcp load"].append(_timed(lambda: dcp_load(root, model, opt))[0])
                else:
                    times["torch.save"].append(_timed(lambda: torch_save(root, model, opt))[0])
                    times["torch.load"].append(_timed(lambda: torch_load(root))[0])
            times["dd write"].append(dd_write(root, nbytes))
            shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"mb": nbytes / 1e6, "seconds": times}


def summarize(raw: dict) -> dict:
    t = raw["seconds"]
    mb = raw["mb"]
    return {
        "state_mb": mb,
        "seconds": {k: spread(v) for k, v in t.items()},
        "mb_per_s": {k: spread(mb / x for x in v) for k, v in t.items()},
        "save_ratio_vs_dcp": spread(a / b for a, b in zip(t["pimm save"], t["dcp save"])),
        "load_ratio_vs_dcp": spread(a / b for a, b in zip(t["pimm load"], t["dcp load"])),
        "save_ratio_vs_torch_save": spread(a / b for a, b in zip(t["pimm save"], t["torch.save"])),
        "save_ratio_vs_dd": spread(a / b for a, b in zip(t["pimm save"], t["dd write"])),
    }


def run(quick: bool = False, sizes=SIZES_MB, rounds: int = 5) -> dict:
    """Measure every size, print the table and write ``results/checkpoint_io.json``."""
    if quick:
        sizes, rounds = (2,), 1
    result = {"quick": quick, "rounds": rounds, "sizes": {}}
    for mb in sizes:
        result["sizes"][f"{mb}MB"] = summarize(measure(mb, rounds))
    table(result)
    write_result("checkpoint_io", result)
    return result


def table(result: dict, file=sys.stdout) -> None:
    rows = []
    for name, s in result["sizes"].items():
        m = s["mb_per_s"]
        rows.append(
            [
                f"{s['state_mb']:.0f} MB",
                fmt_spread(s["save_ratio_vs_dcp"], digits=3),
                fmt_spread(s["load_ratio_vs_dcp"], digits=3),
                fmt_spread(s["save_ratio_vs_torch_save"], digits=3),
                *(
                    f"{m[k]['median']:.0f}"
                    for k in ("pimm save", "dcp save", "torch.save", "dd write", "pimm load", "dcp load", "torch.load")
                ),
            ]
        )
    print_table(
        "Checkpoint throughput (ratios per paired round: median [min..max]; MB/s medians)",
        [
            "state",
            "save / DCP",
            "load / DCP",
            "save / torch.save",
            "pimm save MB/s",
            "DCP save",
            "torch.save",
            "dd",
            "pimm load MB/s",
            "DCP load",
            "torch.load",
        ],
        rows,
        file=file,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=float, nargs="*", default=list(SIZES_MB))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    run(quick=args.quick, sizes=[int(s) if s == int(s) else s for s in args.sizes], rounds=args.rounds)


if __name__ == "__main__":
    main()
