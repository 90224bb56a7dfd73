"""How often a finished 2-rank gloo run exits as failed under load: pimm_fn against a plain torch DDP script.

Each run is ``torchrun --nproc_per_node=2`` of this module as its worker: a
tiny DDP model trains a few steps on gloo (CPU), then the script calls
``torch.distributed.destroy_process_group()`` and returns, as the README's
torchrun recipe does. ``torch``: a plain DDP loop; ``pimm_fn``: the same
model and data through ``pf.loop`` with a ``save_dir`` (a save every 5 steps
and the final one), its preemption agreement and guard on. While the runs
go, two busy processes (``while True: pass``) load the machine beside them;
the kinds alternate, run for run. Reported per kind: torchrun's exit codes,
how many runs a rank aborted at its exit (``terminate called``, SIGABRT)
after training had finished, and, for pimm_fn's, what ``python -m pimm_fn status``
says of each save_dir (0: finished), whatever the exit code.

    python -m benchmarks.exit_codes               # 8 runs of each kind; writes benchmarks/results/exit_codes.json
    python -m benchmarks.exit_codes --runs 20
    python -m benchmarks.exit_codes --quick       # 1 run of each; writes nothing
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import pathlib
import subprocess
import sys
import tempfile

import torch
import torch.distributed as td

from benchmarks._common import free_port, print_table, write_result

KINDS = ("torch", "pimm_fn")
STEPS = 20
ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT = 300  # seconds a run may take on a loaded machine before it counts as hung


def _model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x = torch.randn(4 * STEPS, 8)
    return model, [(x[i : i + 4], x[i : i + 4].sum(1, keepdim=True)) for i in range(0, len(x), 4)]


def _torch_worker() -> None:
    """A plain DDP loop: the baseline, with no pimm_fn imported."""
    from torch.nn.parallel import DistributedDataParallel

    td.init_process_group("gloo")
    model, batches = _model_and_data()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    td.destroy_process_group()
    print(f"finished rank {os.environ['RANK']}", flush=True)


class _Regression(torch.nn.Module):
    """The model as pf.loop's default step reads it: ``model(batch)["loss"]``."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, batch):
        x, y = batch
        return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}


def _pimm_fn_worker(save_dir: str) -> None:
    """The same training through pf.loop: DDP, saves (every 5 steps and the final one), its own gloo groups."""
    import pimm_fn as pf

    td.init_process_group("gloo")
    model, batches = _model_and_data()
    model = _Regression(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run = pf.loop(
        model,
        optimizer,
        batches,
        hooks=[pf.save_every(5)],
        max_epochs=1,
        save_dir=save_dir,
        parallel=pf.Parallel(ddp=True),
        watching=pf.Watching(console=False, progress=False),
    )
    run()
    td.destroy_process_group()
    print(f"finished rank {os.environ['RANK']}", flush=True)


def _once(kind: str, save_dir: str) -> dict:
    """One torchrun of ``kind``: its exit code, and whether a rank aborted after both had finished training."""
    command = [
        str(pathlib.Path(sys.executable).parent / "torchrun"),
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        "-m",
        "benchmarks.exit_codes",
        "--worker",
        kind,
        "--save-dir",
        save_dir,
    ]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"code": "hung", "finished": 0, "aborted": False, "status": None}
    status = None
    if kind == "pimm_fn":  # what a batch script reads instead of the exit code
        status = subprocess.run(
            [sys.executable, "-m", "pimm_fn", "status", save_dir], cwd=ROOT, capture_output=True, timeout=TIMEOUT
        ).returncode
    return {
        "code": done.returncode,
        "finished": done.stdout.count("finished rank"),
        "aborted": "terminate called" in done.stderr or "SIGABRT" in done.stderr,
        "status": status,
    }


@contextlib.contextmanager
def _busy(n: int):
    """``n`` processes spinning beside the runs (each a core's worth of load), killed after."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in spinning:
            proc.kill()
            proc.wait()


def measure(runs: int = 8, busy: int = 2) -> dict:
    outcomes = {kind: [] for kind in KINDS}
    with _busy(busy), tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            for kind in KINDS if i % 2 == 0 else KINDS[::-1]:
                outcomes[kind].append(_once(kind, os.path.join(tmp, f"{kind}-{i}")))
                print(kind, outcomes[kind][-1], flush=True)
    result = {
        "workload": f"torchrun --nproc_per_node=2, gloo (CPU), a 3-layer MLP, {STEPS} DDP steps, then "
        f"destroy_process_group(); {busy} busy processes beside; the kinds alternate",
        "runs": runs,
        "busy_processes": busy,
    }
    for kind, found in outcomes.items():
        result[kind] = {
            "exit_codes": dict(collections.Counter(str(o["code"]) for o in found)),
            "failed": sum(o["code"] != 0 for o in found),
            "aborted_at_exit": sum(o["aborted"] for o in found),
            "aborted_after_both_ranks_finished": sum(o["aborted"] and o["finished"] == 2 for o in found),
            "ranks_finished": sum(o["finished"] for o in found),
        }
        if kind == "pimm_fn":
            result[kind]["status_codes"] = dict(collections.Counter(str(o["status"]) for o in found))
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--busy", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="1 run of each kind; writes nothing")
    p.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)  # torchrun's workers
    p.add_argument("--save-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "torch":
        return _torch_worker()
    if args.worker == "pimm_fn":
        return _pimm_fn_worker(args.save_dir)
    result = measure(1 if args.quick else args.runs, args.busy)
    rows = [
        [
            kind,
            str(result["runs"]),
            str(result[kind]["failed"]),
            str(result[kind]["aborted_at_exit"]),
            str(result[kind]["aborted_after_both_ranks_finished"]),
            " ".join(f"{c}x{n}" for c, n in result[kind]["exit_codes"].items()),
            " ".join(f"{c}x{n}" for c, n in result[kind].get("status_codes", {}).items()) or "-",
        ]
        for kind in KINDS
    ]
    print_table(
        f"finished 2-rank runs under load ({result['busy_processes']} busy processes beside)",
        ["kind", "runs", "failed", "aborted at exit", "aborted after finishing", "exit codes", "status codes"],
        rows,
    )
    if not args.quick:
        write_result("exit_codes", result)


if __name__ == "__main__":
    main()
