"""One rank of a torchrun replica group of the fault-tolerance tests (``test_fault_tolerance_torchrun.py``).

    torchrun --nproc-per-node 2 _ft_ranks.py '<json options>'

The group's gloo process group from torchrun's environment, the replica
group's id and the lighthouse from ``REPLICA_GROUP_ID`` and
``TORCHFT_LIGHTHOUSE``, then ``_ft_workers.main`` with this rank's own
files (``out``, ``ready`` and ``started`` end in ``-rank<r>``). At the end a
``parameters`` line: digests of the parameters and the optimizer state,
which every rank of every group holds alike (the buffers are each rank's
own: DDP broadcasts rank 0's at the start of a forward). With ``refused``
set, it first asks ``loop()`` for the model outside DDP and writes what it
raised. It ends itself after ``bound_s`` seconds whatever happens.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback

import torch
import torch.distributed as td

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ft_workers as workers  # noqa: E402

import pimm_fn as pf  # noqa: E402


def refused(save_dir: str) -> str:
    """What ``loop()`` raises for a torchrun group's model outside DDP (``Parallel(ddp=False)``)."""
    model = workers.Net()
    try:
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.05),
            workers.loader(),
            max_steps=1,
            save_dir=save_dir,
            parallel=pf.Parallel(fault_tolerant=pf.FaultTolerance()),
        )
    except ValueError as exc:
        return str(exc)
    return "nothing raised"


def main(opts: dict) -> None:
    td.init_process_group("gloo")
    rank = td.get_rank()
    opts["out"] = f"{opts['out']}-rank{rank}"
    if opts.get("die_rank", rank) != rank:  # only that rank of the group is killed
        opts.pop("die_at", None)
    for key in ("ready", "started"):
        if opts.get(key):
            opts[key] = f"{opts[key]}-rank{rank}"
    if opts.get("refused"):
        append(opts["out"], kind="refused", message=refused(opts["refused"]))
    run = workers.main(opts)
    model, optimizer = run.ctx.model.module, run.ctx.optimizer  # the model in DDP
    append(
        opts["out"],
        kind="parameters",
        digest=workers.digest(dict(model.named_parameters())),
        optimizer=workers.digest(optimizer.state_dict()["state"]),
    )


def append(out: str, **record) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    options = json.loads(sys.argv[1])
    threading.Timer(options.get("bound_s", 90), lambda: os._exit(4)).start()  # never outlive the test
    try:
        main(options)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(3)
    sys.stdout.flush()
    os._exit(0)
