"""The two replicas of the heal tests (``test_heal.py``): each a run of its own, without a default process group,
joined by a gloo group made apart from it, as torchft joins its replica groups.

    python _heal_workers.py <function> <rank> <world> <out_dir> <json kwargs>

as ``tests/distributed/_launch.run_ranks(..., script=)`` runs it; results go to
``out_dir`` as ``<tag>-rank<r>.pkl`` (the test's own files, read by the test).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import pathlib
import pickle
import sys
import traceback

import torch
import torch.distributed as td
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf
from pimm_fn.runtime.replicas import heal
from pimm_fn.runtime.step.rng import capture_rng

STEPS = 7  # the source trains these before it sends: mid-epoch (12 steps an epoch), after a save, an evaluation, a best
MORE = 9  # then both train these: past the epoch's end, another save, evaluations
TIMEOUT = datetime.timedelta(seconds=30)


class Net(nn.Module):
    """A 2-layer MLP with dropout (so the RNG states must come across), returning its loss."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Dropout(0.2), nn.Linear(width, 1))

    def forward(self, batch):
        x, y = batch
        return {"loss": F.mse_loss(self.body(x).squeeze(-1), y)}


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(48, 8, generator=g)
    return TensorDataset(x, x.sum(1) + 0.1 * torch.randn(48, generator=g))


def val_loss(model):
    """The loss on the training samples, in eval mode."""
    x, y = _dataset().tensors
    model.eval()
    with torch.no_grad():
        loss = F.mse_loss(model.body(x).squeeze(-1), y)
    model.train()
    return {"val_loss": float(loss)}


def build(save_dir, *, seed: int, width: int = 16):
    """A run of every part a heal carries: Adam, a scheduler, an EMA, slots of a saver, an evaluator and a best."""
    torch.manual_seed(seed)  # each replica starts otherwise: what it ends with came from its peer
    model = Net(width)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return pf.loop(
        model,
        optimizer,
        DataLoader(_dataset(), batch_size=4, shuffle=True),
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5),
        hooks=[
            pf.ema(0.9),
            pf.evaluate_every(3, val_loss, name="val"),
            pf.save_every(4),
            pf.best_on("val_loss", mode="min"),
            pf.log_every(2),
        ],
        max_epochs=3,
        save_dir=save_dir,
        watching=pf.Watching(console=False, progress=False),
    )


def snapshot(run) -> dict:
    """Everything a heal carries, copied: weights, optimizer, scheduler, EMA, State, data cursor, RNG states."""
    ctx = run.ctx
    return copy.deepcopy(
        {
            "weights": ctx.weights(),
            "optimizer": ctx.optimizer.state_dict(),
            "scheduler": ctx.scheduler.state_dict(),
            "ema": ctx.extra_state["ema"].state_dict(),
            "state": run.state,
            "cursor": ctx.feed.state_dict(),
            "rng": capture_rng(),
        }
    )


@contextlib.contextmanager
def no_unpickling():
    """Record every call of pickle's and torch's loaders meanwhile: a heal reads no peer byte through them."""
    calls: list[str] = []
    saved = {(pickle, "loads"), (pickle, "load"), (torch, "load")}
    originals = {(m, n): getattr(m, n) for m, n in saved}

    def recorder(name, real):
        def called(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        return called

    for (module, name), real in originals.items():
        setattr(module, name, recorder(f"{module.__name__}.{name}", real))
    try:
        yield calls
    finally:
        for (module, name), real in originals.items():
            setattr(module, name, real)


@contextlib.contextmanager
def replaced(name: str, fn):
    """``heal.<name>`` replaced by ``fn`` meanwhile: the sender's messages damaged on purpose."""
    real = getattr(heal, name)
    setattr(heal, name, fn(real))
    try:
        yield
    finally:
        setattr(heal, name, real)


def _refusal(call) -> str | None:
    try:
        call()
    except heal.HealError as exc:
        return str(exc)
    return None


def _damaged(real):
    """The document with its skeleton cut in half: valid JSON around a pack skeleton that does not decode."""
    return lambda skeleton, tensors, step: real(skeleton[: len(skeleton) // 2], tensors, step)


def _future(real):
    return lambda version, size, count: real(99, size, count)


def _declaring(run, shape):
    """The document declaring the first parameter's Adam ``exp_avg`` as of ``shape``; the tensors sent stay."""
    moment = run.ctx.optimizer.state[next(run.ctx.model.parameters())]["exp_avg"]

    def wrap(real):
        def declared(skeleton, tensors, step):
            listed = [torch.empty(shape, device="meta") if t.data_ptr() == moment.data_ptr() else t for t in tensors]
            assert len(listed) == len(tensors) and any(t.is_meta for t in listed)
            return real(skeleton, listed, step)

        return declared

    return wrap


def _dies_after(sends: int) -> None:
    """This process ends at once (its sockets closed) after its ``sends``-th message of a heal."""
    real, sent = heal._Wire.send, []

    def send(wire, tensor, what):
        real(wire, tensor, what)
        sent.append(what)
        if len(sent) == sends:
            sys.stdout.flush()
            os._exit(0)

    heal._Wire.send = send


def _cut(call) -> str | None:
    try:
        call()
    except heal.HealCut as exc:
        return str(exc)
    return None


def heal_pair(rank, world, out, *, save_dir, tag):
    """Rank 0 trains, sends, trains on; rank 1 receives into a fresh run, trains on. Then five refused heals.

    First ranks 2 and 3 (a world of 4) each start a heal of rank 1 and end,
    their sockets closed: rank 2 after the header, rank 3 after three tensors.
    """
    store = td.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0, timeout=TIMEOUT)
    group = td.ProcessGroupGloo(store, rank, world, TIMEOUT)
    result = {}
    if rank in (2, 3):
        run = build(f"{save_dir}/cut{rank}", seed=300 + rank)
        _dies_after(1 if rank == 2 else 5)  # the header; the header, the document and three tensors
        heal.send_state(run, 1, group)
        raise AssertionError("the heal ended: this process was to end on the way")
    if rank == 0:
        run = build(f"{save_dir}/source", seed=100)
        run.run(STEPS)
        result["healed"] = heal.send_state(run, 1, group)
        result["at"] = snapshot(run)
        run.run(MORE)
        result["after"] = snapshot(run)
        with replaced("document", _damaged):
            result["damaged"] = _refusal(lambda: heal.send_state(run, 1, group))
        with replaced("header", _future):
            result["version"] = _refusal(lambda: heal.send_state(run, 1, group))
        wide = build(f"{save_dir}/wide", seed=100, width=32)
        result["wide"] = _refusal(lambda: heal.send_state(wide, 1, group))
        with replaced("document", _declaring(run, [2**36])):  # 256 GB, never allocated on either side
            result["huge"] = _refusal(lambda: heal.send_state(run, 1, group))
        with replaced("document", _declaring(run, [1024, 1024])):  # 4 MB for the moment of a [16, 8] weight
            result["swollen"] = _refusal(lambda: heal.send_state(run, 1, group))
    else:
        run = build(f"{save_dir}/healed", seed=200)
        result["before cuts"] = snapshot(run)
        result["cuts"] = [_cut(lambda: heal.receive_state(run, src, group)) for src in (2, 3)]
        result["after cuts"] = snapshot(run)
        with no_unpickling() as calls:
            result["healed"] = heal.receive_state(run, 0, group)
        result["unpickled"] = calls
        result["at"] = snapshot(run)
        run.run(MORE)
        result["after"] = snapshot(run)
        fresh = build(f"{save_dir}/refusing", seed=200)
        result["before"] = snapshot(fresh)
        for case in ("damaged", "version", "wide", "huge"):
            result[case] = _refusal(lambda: heal.receive_state(fresh, 0, group))  # Adam before its first step
        result["unchanged"] = snapshot(fresh)
        result["trained before"] = snapshot(run)  # the process's RNG is since fresh's seed
        result["swollen"] = _refusal(lambda: heal.receive_state(run, 0, group))  # Adam with its moments
        result["trained unchanged"] = snapshot(run)
    with open(pathlib.Path(out) / f"{tag}-rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)


def main(argv) -> int:
    function, rank, world, out, kwargs = argv[1], int(argv[2]), int(argv[3]), argv[4], json.loads(argv[5])
    torch.set_num_threads(1)
    try:
        globals()[function](rank, world, out, **kwargs)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # the group's store lives in rank 0: no finalization that could wait on a peer


if __name__ == "__main__":
    sys.exit(main(sys.argv))
