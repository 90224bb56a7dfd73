"""One replica group of the fault-tolerance tests (``test_fault_tolerance.py``): a process of its own.

    python _ft_workers.py '<json options>'

It trains a tiny model under ``Parallel(fault_tolerant=...)`` against the
test's lighthouse, with a saver, an evaluator and a best, and appends a JSON
line to ``out`` at each step's start (after the quorum: a digest of the
weights, the optimizer state, the ``State`` and the data cursor) and at each
committed step, flushed, so a killed replica leaves what it did. Options:
``die_at`` and ``die_in`` (``"step"``: after its hooks, ``"forward"``,
``"save"``, ``"eval"``) SIGKILL it there, ``"hang"`` SIGSTOPs it in the
forward; ``hold_at`` and ``hold_until`` keep it at a step until a file exists
(writing the file ``held`` names there first; the restarted replica writes
``started`` once it joined the lighthouse);
``ready`` and ``barrier``: it writes its file, then waits for all of them.
``scaler`` (an initial scale) trains with a GradScaler, ``on_nonfinite`` is
the policy, ``nan_at`` makes this replica's loss NaN at a step and
``overflow_at`` its scaled gradients overflow; ``named`` trains two named
optimizers with a custom step.
``save_every`` is its saver's cadence (4), ``local_at`` a step after which a
hook of its own emits a collective ``Call`` on this group alone (a decision
from a group-local input). A ``CollectiveDivergenceError`` or a
``NonFiniteLossError`` out of the run is a line too (with the parameters);
the end's line says how many steps compared what the groups folded.
Each step's start and the end carry the effects the run executed since the
line before (``run.trace``), each evaluation its values.
Each rank of a torchrun group runs ``main`` too (``_ft_ranks.py``), the model
in DDP there.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pimm_fn as pf
from pimm_fn.checkpoint import publish
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Call, Scope

STEPS_PER_EPOCH = 8


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(4)  # running statistics each replica moves with its own batches
        self.body = nn.Linear(4, 1)

    def forward(self, batch):
        x, y = batch[:2]  # then the samples' indices
        return {"loss": F.mse_loss(self.body(self.norm(x)).squeeze(-1), y)}


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4 * STEPS_PER_EPOCH, 4, generator=g)
    return TensorDataset(x, x.sum(1), torch.arange(len(x)))


def loader() -> DataLoader:
    """Batches of 4, shuffled each epoch by an order every replica computes alike (what the replicas deal)."""
    data = dataset()
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=3))


def digest(value) -> str:
    """A digest of tensors, dicts, lists and scalars, the same for equal values."""
    h = hashlib.sha256()

    def feed(v) -> None:
        if isinstance(v, torch.Tensor):
            h.update(f"T{v.dtype}{tuple(v.shape)}".encode())
            h.update(v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(v, dict):
            for k in sorted(v, key=repr):
                h.update(repr(k).encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            for x in v:
                feed(x)
        else:
            h.update(repr(v).encode())

    feed(value)
    return h.hexdigest()[:16]


def val_loss(model) -> dict:
    model = getattr(model, "module", model)  # a torchrun group's, in DDP
    x, y, _ = dataset().tensors
    with torch.no_grad():
        return {"val_loss": float(F.mse_loss(model.body(x).squeeze(-1), y))}


def noted(state, ctx) -> None:
    """What the group-local decision calls: nothing (its effect is what the groups compare)."""


def wait_for(paths: list[str], bound_s: float = 30.0) -> None:
    deadline = time.monotonic() + bound_s
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.01)


def both(model, optimizers, batch, *, scheduler=None, scaler=None):
    """A custom step of two named optimizers: one backward, then each optimizer steps."""
    for optimizer in optimizers.values():
        optimizer.zero_grad()
    loss = model(batch)["loss"]
    loss.backward()
    for optimizer in optimizers.values():
        optimizer.step()
    return {"loss": loss.detach()}


def main(opts: dict):
    out = open(opts["out"], "a", buffering=1)
    torch.manual_seed(opts.get("seed", 0))
    model = Net()
    if opts.get("named"):
        optimizers = {
            "body": torch.optim.SGD(model.body.parameters(), lr=0.05, momentum=0.9),
            "norm": torch.optim.Adam(model.norm.parameters(), lr=0.01),
        }
    else:
        optimizers = {"optimizer": torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)}
    scaler = torch.amp.GradScaler("cpu", init_scale=opts["scaler"]) if opts.get("scaler") else None
    holder: dict = {}
    die_at, die_in = opts.get("die_at"), opts.get("die_in", "step")

    def line(**record) -> None:
        out.write(json.dumps(record) + "\n")

    def executed() -> list:
        """The effects executed since the last call: ``[step, event, effect, hook]`` each."""
        trace = list(holder["run"].trace)
        new, holder["traced"] = trace[holder.get("traced", 0) :], len(trace)
        return [[e.step, type(e.event).__name__, repr(e.effect), e.hook] for e in new]

    def watch(state, event):
        replicas = holder["run"].ctx.replicas
        if event.__class__ is ev.BeforeStep:
            feed = holder["run"].ctx.feed
            parts = {
                "weights": model.state_dict(),
                "params": dict(model.named_parameters()),
                "optimizer": {name: o.state_dict()["state"] for name, o in optimizers.items()},
                "scaler": scaler.state_dict() if scaler is not None else None,
                "progress": repr(state.progress),
                "best": repr(state.best),
                "cursor": feed.state_dict(),
            }
            line(
                kind="begin",
                step=event.step,
                digest=digest(parts),
                parts={k: digest(v) for k, v in parts.items()},
                healed=replicas.healed is not None and replicas.healed.step == event.step - 1,
                participants=replicas.participants,
                scale=scaler.get_scale() if scaler is not None else None,
                effects=executed(),
            )
        else:
            line(
                kind="commit",
                step=event.step,
                epoch=state.progress.epoch,
                samples=holder["samples"],
                participants=replicas.participants,
                writes=replicas.writes,
                skipped=holder["run"].ctx.nonfinite.count,
            )
            if die_at == event.step and die_in == "step":
                os.kill(os.getpid(), signal.SIGKILL)
            if opts.get("hold_at") == event.step:
                if opts.get("held"):
                    open(opts["held"], "w").close()  # the test restarts the killed one only now
                wait_for([opts["hold_until"]])
        return state, ()

    watch.events = (ev.BeforeStep, ev.AfterStep)

    def local_decision(state, event):  # the same hook on every group; what it decides reads the group's own option
        if opts.get("local_at") == event.step:
            return state, (Call.of(noted, event.step, scope=Scope.COLLECTIVE),)
        return state, ()

    local_decision.events = (ev.AfterStep,)

    def val(m):
        step = holder["run"].state.progress.global_step
        if die_at == step and die_in == "eval":
            os.kill(os.getpid(), signal.SIGKILL)
        values = val_loss(m)
        line(kind="eval", step=step, values=values)
        return values

    staged = publish.publish_staged

    def publishing(*args, **kwargs):  # a save killed between its files written and their publication
        if die_in == "save" and die_at == holder["run"].state.progress.global_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return staged(*args, **kwargs)

    publish.publish_staged = publishing

    def forward(module, args) -> None:  # killed in the step's forward: its peers' all-reduce fails, their vote too
        holder["samples"] = args[0][2].tolist()  # the indices this replica trains in the step
        if die_in in ("forward", "hang") and die_at == holder["run"].state.progress.global_step + 1:
            os.kill(os.getpid(), signal.SIGKILL if die_in == "forward" else signal.SIGSTOP)

    model.register_forward_pre_hook(forward)

    def poison(module, args, output):  # this replica's loss NaN at a step, or its scaled gradients overflowing
        step = holder["run"].state.progress.global_step + 1
        if step == opts.get("nan_at"):
            output["loss"] = output["loss"] * float("nan")
        elif step == opts.get("overflow_at"):
            output["loss"] = output["loss"] * 1e36  # finite; times the scale, past float32's range
        return output

    model.register_forward_hook(poison)
    tolerance = pf.FaultTolerance(
        min_replicas=opts.get("min_replicas", 1),
        lighthouse=opts.get("lighthouse"),  # else TORCHFT_LIGHTHOUSE
        replica_group=str(opts["replica"]) if "replica" in opts else None,  # else REPLICA_GROUP_ID
        quorum_timeout=opts.get("quorum_timeout", 20),
        timeout=opts.get("timeout", 5),
        connect_timeout=opts.get("connect_timeout", 5),
    )
    run = pf.loop(
        model,
        optimizers if opts.get("named") else optimizers["optimizer"],
        loader(),
        hooks=[
            pf.evaluate_every(3, val, name="val"),
            pf.save_every(opts.get("save_every", 4)),
            pf.best_on("val_loss", mode="min"),
            watch,
            *([local_decision] if "local_at" in opts else []),
        ],
        max_steps=opts["max_steps"],
        save_dir=opts["save_dir"],
        resume="auto",
        step_fn=both if opts.get("named") else None,
        training=pf.Training(scaler=scaler, on_nonfinite=opts.get("on_nonfinite", "raise")),
        parallel=pf.Parallel(ddp=True, fault_tolerant=tolerance),  # a torchrun group in DDP; no-op in one process
        watching=pf.Watching(sanity_check=0, progress=False),
    )
    holder["run"] = run
    for done in (opts.get("started"), opts.get("ready")):
        if done:
            open(done, "w").close()
    wait_for(opts.get("barrier", []))  # the first groups start together
    try:
        run.run()
    except (pf.CollectiveDivergenceError, pf.NonFiniteLossError) as exc:
        line(
            kind="error",
            step=run.state.progress.global_step,
            message=str(exc),
            params=digest(dict(model.named_parameters())),
        )
        raise
    state = {
        "optimizer": {name: o.state_dict() for name, o in optimizers.items()},
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    compared = run.ctx.replicas.agreement.comparisons
    line(
        kind="end",
        step=run.state.progress.global_step,
        weights=digest(model.state_dict()),
        state=digest(state),
        compared=compared,
        effects=executed(),
    )
    return run


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(3)
    os._exit(0)
