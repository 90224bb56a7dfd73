"""The tiny workload trained to a step budget (``max_steps``), as a subprocess the kill tests can SIGKILL.

Run as a script: train (maybe resuming), optionally SIGKILL itself after a
step, and save the final weights and trace.
"""

import argparse
import os
import signal

import torch

from _tiny_workload import build, weights


def main():
    """Subprocess entry: train to ``--max-steps``, killing itself after ``--kill-at`` when given."""
    parser = argparse.ArgumentParser()
    parser.add_argument("save_dir")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--kind", default="plain")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    model, run = build(
        args.save_dir, kind=args.kind, resume="auto" if args.resume else None, max_epochs=None, max_steps=args.max_steps
    )
    if args.kill_at:
        while not run.finished:
            run.step()
            if run.state.progress.global_step == args.kill_at:
                print(f"killing at step {args.kill_at}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    else:
        run()
    if args.out:
        torch.save(
            {"weights": weights(model), "trace": [repr(e) for e in run.trace], "step": run.state.progress.global_step},
            args.out,
        )


if __name__ == "__main__":
    main()
