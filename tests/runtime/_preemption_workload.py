"""A script that trains the tiny workload slowly, for real signals from outside (the preemption tests).

    python _preemption_workload.py <save_dir> <ready_file> [--save-on-interrupt] [--resume]

It writes ``ready_file`` once two steps trained, then trains on, about
15 ms a step, as any user script would: ``run()`` at the top level, nothing
caught. What the test sends it (SIGTERM, SIGINT) decides how it ends.
"""

import argparse
import os
import pathlib
import signal
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _tiny_workload as tw  # noqa: E402
import pimm_fn as pf  # noqa: E402

HOOKS = dict(save_every=5, evaluate_every=4)


def slow_steps(model, ready: pathlib.Path | None = None, seconds: float = 0.015):
    """Each training forward sleeps ``seconds`` (the numbers stay the same); ``ready`` is written at the second."""
    calls = []

    def pause(module, args):
        if module.training and len(calls) == 1 and ready is not None:
            ready.write_text("ready")
        calls.append(1)
        time.sleep(seconds)

    return model.register_forward_pre_hook(pause)


def signal_at_forward(model, n: int, sig=signal.SIGTERM):
    """Send ``sig`` to this process from inside the ``n``-th training forward (1-based): during step ``n``."""
    calls = []

    def send(module, args):
        if module.training and torch.is_grad_enabled():
            calls.append(1)
            if len(calls) == n:
                os.kill(os.getpid(), sig)

    return model.register_forward_pre_hook(send)


def build(save_dir, *, resume=None, max_epochs=6, preemption=None, console=False, **kwargs):
    """The run every preemption test compares: the tiny workload with a save every 5 and an evaluation every 4 steps."""
    extra = {"preemption": preemption} if preemption is not None else {}
    return tw.build(
        save_dir,
        resume=resume,
        max_epochs=max_epochs,
        hooks=tw.standard_hooks(**HOOKS),
        console=console,
        **extra,
        **kwargs,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("save_dir")
    parser.add_argument("ready")
    parser.add_argument("--save-on-interrupt", action="store_true")
    parser.add_argument("--resume", action="store_true", help='build the loop with resume="auto"')
    args = parser.parse_args()
    model, run = build(
        args.save_dir,
        console=True,
        resume="auto" if args.resume else None,
        preemption=pf.Preemption(save_on_interrupt=args.save_on_interrupt),
    )
    slow_steps(model, pathlib.Path(args.ready))
    run()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
