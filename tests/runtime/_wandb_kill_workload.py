"""A script logging every step to W&B (offline) that blocks in step 6, to be SIGKILLed (test_wandb_steps_after_kill).

    python _wandb_kill_workload.py <save_dir> <ready_file>

Its last checkpoint is step 3's; steps 4 and 5 are logged to W&B after it.
"""

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _tiny_workload as tw  # noqa: E402
import pimm_fn as pf  # noqa: E402
from pimm_fn.runtime.logs.trackers import WandbLogger  # noqa: E402

HOOKS = [pf.save_every(3), pf.log_every(1)]
BLOCK_AT = 6  # the training forward that writes the ready file and waits for the kill


def build(save_dir, resume=None):
    return tw.build(
        save_dir,
        hooks=HOOKS,
        max_epochs=2,
        resume=resume,
        loggers=[WandbLogger(project="pimm_fn-test", mode="offline")],
    )


def main():
    save_dir, ready = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    model, run = build(save_dir)
    calls = []

    def block(module, args):
        if module.training:
            calls.append(1)
            if len(calls) == BLOCK_AT:
                ready.write_text("ready")
                time.sleep(120)  # the test kills this process here

    model.register_forward_pre_hook(block)
    run()


if __name__ == "__main__":
    main()
