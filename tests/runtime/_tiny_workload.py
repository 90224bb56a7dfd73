"""A tiny, deterministic training workload shared by the runtime tests.

Importable by spawned subprocesses (the kill-and-resume tests), so it keeps
everything at module level.
"""

import math

import attrs
import torch
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf


class TinyNet(torch.nn.Module):
    """Two linear layers with dropout, so RNG state matters for exact resume."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(4, 8)
        self.drop = torch.nn.Dropout(0.25)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.out(self.drop(torch.relu(self.hidden(x)))) - y) ** 2).mean()}


class NaNAt(TinyNet):
    """TinyNet whose loss is NaN on its ``at``-th call (counting from 1)."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, batch):
        self.calls += 1
        out = super().forward(batch)
        return {"loss": out["loss"] * math.nan} if self.calls == self.at else out


class FailsOnce(TinyNet):
    """TinyNet whose forward raises once, on its ``at``-th call (counting from 1)."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, batch):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("a failing forward")
        return super().forward(batch)


@attrs.frozen
class SumsBetween:
    """An accumulating hook called every ``n`` steps: its slot sums the losses of the steps its cadence skips."""

    n: int
    events = (pf.events.AfterStep,)

    @property
    def every(self):
        return self.n

    def init(self):
        return 0.0

    def accumulate(self, slot, outputs):
        return slot + outputs["loss"]

    def __call__(self, state, event):
        return state, ()


def dataset(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def loader(kind="plain", batch_size=8):
    """A shuffled loader: 'plain' DataLoader, 'stateful' StatefulDataLoader, or 'generator' (own generator)."""
    data = dataset()
    if kind == "plain":
        return DataLoader(data, batch_size=batch_size, shuffle=True)
    from torchdata.stateful_dataloader import StatefulDataLoader

    generator = torch.Generator().manual_seed(7) if kind == "generator" else None
    return StatefulDataLoader(data, batch_size=batch_size, shuffle=True, generator=generator)


def one_long_epoch(steps, batch_size=8):
    """An epoch of ``steps`` batches, cheaply: one batch, repeated."""
    return [dataset(batch_size).tensors] * steps


def negative_mse(model):
    """An evaluator: higher is better, changes every evaluation."""
    x, y = dataset(16, seed=1).tensors
    with torch.no_grad():
        return {"score": -float(((model.out(torch.relu(model.hidden(x))) - y) ** 2).mean())}


def standard_hooks(save_every=3, evaluate_every=4):
    return [
        pf.evaluate_every(evaluate_every, negative_mse, name="val"),
        pf.save_every(save_every),
        pf.best_on("score"),
        pf.log_every(5),
    ]


def build(
    save_dir,
    *,
    kind="plain",
    resume=None,
    max_epochs=3,
    hooks=None,
    fmt="standard",
    console=False,
    watching=None,
    saving=None,
    **kwargs,
):
    """A fresh model, optimizer, scheduler and loop, seeded identically every time (quiet unless ``console``).

    ``saving`` replaces ``Saving(checkpoint_format=fmt)``.
    """
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.9)
    run = pf.loop(
        model,
        optimizer,
        loader(kind),
        hooks=standard_hooks() if hooks is None else hooks,
        max_epochs=max_epochs,
        save_dir=save_dir,
        scheduler=scheduler,
        resume=resume,
        saving=saving or pf.Saving(checkpoint_format=fmt),
        watching=attrs.evolve(watching or pf.Watching(), console=console),
        **kwargs,
    )
    return model, run


def snapshotting():
    """Save every 4 steps with a snapshot each: a 10-step run leaves last (step 10), iter_4, iter_8 and iter_10."""
    return [pf.save_every(4, snapshots=True)]


def finished(save_dir, fmt="standard") -> dict:
    """A finished 10-step run (2 epochs) in ``save_dir``, saved as ``snapshotting`` says; returns its final weights."""
    model, run = build(save_dir, hooks=snapshotting(), max_epochs=2, fmt=fmt)
    run()
    return weights(model)


def weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def same(a, b) -> bool:
    """Equal, tensors bit for bit, at any depth."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def main():
    """Subprocess entry: train (maybe resuming), optionally SIGKILL itself at a step, save final weights."""
    import argparse
    import os
    import signal

    parser = argparse.ArgumentParser()
    parser.add_argument("save_dir")
    parser.add_argument("--kind", default="plain")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    model, run = build(args.save_dir, kind=args.kind, resume="auto" if args.resume else None)
    if args.kill_at:
        while not run.finished:
            run.step()
            if run.state.progress.global_step == args.kill_at:
                print(f"killing at step {args.kill_at}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    else:
        run()
    if args.out:
        torch.save({"weights": weights(model), "trace": [repr(e) for e in run.trace]}, args.out)


if __name__ == "__main__":
    main()
