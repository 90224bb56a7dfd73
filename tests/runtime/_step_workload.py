"""The tiny workload trained with a configured ``TrainStep``, for the kill-and-resume tests.

    python _step_workload.py SAVE_DIR --accumulate 3 --precision bf16 --clip 0.5 [--kind stateful]
                             [--supervised] [--resume] [--kill-at STEP] [--out FILE]

40 samples in batches of 4 are 10 batches an epoch: with ``--accumulate 3``
an epoch is 3 optimizer steps and one batch is left out, so the batches of
a step do not line up with the loader's epochs. ``--supervised`` trains the
same network as a plain model of ``x`` with ``TrainStep(loss_fn=mse_loss)``.
"""

import argparse
import os
import signal
import sys

import torch

import pimm_fn as pf
from _tiny_workload import TinyNet, loader, standard_hooks, weights


class Plain(TinyNet):
    """TinyNet as a plain model: ``x`` in, predictions out, for the supervised step."""

    def forward(self, x):
        return self.out(self.drop(torch.relu(self.hidden(x))))


def build(save_dir, *, kind, accumulate, precision, clip, resume, supervised=False):
    """A fresh model, optimizer, scheduler and loop with a TrainStep, seeded identically every time."""
    torch.manual_seed(0)
    model = Plain() if supervised else TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.9)
    step = pf.TrainStep(
        device="cpu",
        precision=precision,
        accumulate=accumulate,
        clip_grad_norm=clip,
        loss_fn=torch.nn.functional.mse_loss if supervised else None,
    )
    run = pf.loop(
        model,
        optimizer,
        loader(kind, batch_size=4),
        hooks=standard_hooks(save_every=2, evaluate_every=3),
        max_epochs=3,
        save_dir=save_dir,
        scheduler=scheduler,
        resume=resume,
        watching=pf.Watching(console=False),
        step_fn=step,
    )
    return model, run


def main(argv) -> None:
    """Train (maybe resuming), optionally SIGKILL itself after a step, save the final weights and trace."""
    parser = argparse.ArgumentParser()
    parser.add_argument("save_dir")
    parser.add_argument("--kind", default="plain")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--precision", default="32")
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--supervised", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    model, run = build(
        args.save_dir,
        kind=args.kind,
        accumulate=args.accumulate,
        precision=args.precision,
        clip=args.clip,
        resume="auto" if args.resume else None,
        supervised=args.supervised,
    )
    while not run.finished:
        run.step()
        if args.kill_at and run.state.progress.global_step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    if args.out:
        torch.save(
            {"weights": weights(model), "trace": [repr(e) for e in run.trace], "steps": run.state.progress.global_step},
            args.out,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
