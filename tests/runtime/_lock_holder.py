"""A run that trains 3 steps into SAVE_DIR (saving at step 2), says "holding" and waits to be killed.

Run by ``test_save_dir_lock.py`` as the first of two runs on one save_dir.
Bounded: it exits by itself after ``--hold`` seconds.
"""

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _tiny_workload as tw  # noqa: E402

import pimm_fn as pf  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("save_dir")
    parser.add_argument("--hold", type=float, default=60.0)
    args = parser.parse_args()
    _, run = tw.build(args.save_dir, hooks=[pf.save_every(2)], max_epochs=3, resume="auto")
    run.run(steps=3)
    print("holding", flush=True)
    time.sleep(args.hold)
