"""A tiny GAN-like workload with two optimizers, an EMA and extra state, for the kill-and-resume tests.

Importable by spawned subprocesses, so everything is at module level.
"""

import torch
import torch.nn.functional as F

import pimm_fn as pf
from _tiny_workload import loader


class TinyGan(torch.nn.Module):
    """A generator from 2-d noise to 4-d points and a discriminator with dropout and BatchNorm."""

    def __init__(self):
        super().__init__()
        self.g = torch.nn.Linear(2, 4)
        self.d = torch.nn.Sequential(
            torch.nn.Linear(4, 8),
            torch.nn.BatchNorm1d(8),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.25),
            torch.nn.Linear(8, 1),
        )


class RunningMean:
    """Extra state: the mean of the real samples seen, kept outside the model."""

    def __init__(self):
        self.total = torch.zeros(4)
        self.count = 0

    def update(self, x) -> None:
        self.total += x.sum(0)
        self.count += x.shape[0]

    def state_dict(self) -> dict:
        return {"total": self.total, "count": self.count}

    def load_state_dict(self, state) -> None:
        self.total = state["total"].clone()
        self.count = state["count"]


class GanStep:
    """One discriminator step, then one generator step; the noise comes from the torch RNG."""

    def __init__(self, stats: RunningMean):
        self.stats = stats

    def __call__(self, model, optimizer, batch, *, scheduler=None, scaler=None):
        real, _ = batch
        fake = model.g(torch.randn(real.shape[0], 2))
        optimizer["d"].zero_grad(set_to_none=True)
        d_loss = F.softplus(-model.d(real)).mean() + F.softplus(model.d(fake.detach())).mean()
        d_loss.backward()
        optimizer["d"].step()
        optimizer["g"].zero_grad(set_to_none=True)
        g_loss = F.softplus(-model.d(fake)).mean()
        g_loss.backward()
        optimizer["g"].step()
        self.stats.update(real)
        return {"loss": (d_loss + g_loss).detach(), "d_loss": d_loss.detach(), "g_loss": g_loss.detach()}


def realism(model):
    """An evaluator: higher when generated points are near the data's mean."""
    z = torch.randn(16, 2, generator=torch.Generator().manual_seed(3))
    return {"score": -float(model.g(z).mean(0).sub(0.0).pow(2).sum())}


def build(save_dir, *, resume=None, async_save=False, max_epochs=3):
    """A fresh GAN, its two optimizers, an EMA and a running mean, seeded identically every time."""
    torch.manual_seed(0)
    model = TinyGan()
    optimizers = {
        "g": torch.optim.Adam(model.g.parameters(), lr=0.01),
        "d": torch.optim.Adam(model.d.parameters(), lr=0.02, betas=(0.5, 0.9)),
    }
    stats = RunningMean()
    hooks = [
        pf.ema(0.8),
        pf.evaluate_every(4, realism, name="val", weights="ema"),
        pf.save_every(3, async_save=async_save),
        pf.best_on("score"),
        pf.log_every(5),
    ]
    run = pf.loop(
        model,
        optimizer=optimizers,
        train_data=loader("plain"),
        step_fn=GanStep(stats),
        hooks=hooks,
        max_epochs=max_epochs,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=False),
        training=pf.Training(extra_state={"stats": stats}),
    )
    return model, run


def snapshot(model, run) -> dict:
    """Everything that must come back exactly: weights, optimizers, the average, the extra state, the trace."""
    return {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizers": {k: o.state_dict() for k, o in run.ctx.optimizers.items()},
        "ema": run.ctx.extra_state["ema"].state_dict(),
        "stats": run.ctx.extra_state["stats"].state_dict(),
        "trace": [repr(e) for e in run.trace],
    }


def main():
    """Subprocess entry: train (maybe resuming), optionally SIGKILL itself at a step, save what came out."""
    import argparse
    import os
    import signal

    parser = argparse.ArgumentParser()
    parser.add_argument("save_dir")
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    model, run = build(args.save_dir, resume="auto" if args.resume else None, async_save=args.async_save)
    if args.kill_at:
        while not run.finished:
            run.step()
            if run.state.progress.global_step == args.kill_at:
                run.ctx.wait_for_save()  # the checkpoint of that step is on disk: the kill lands after it
                os.kill(os.getpid(), signal.SIGKILL)
    else:
        run()
    if args.out:
        torch.save(snapshot(model, run), args.out)


if __name__ == "__main__":
    main()
