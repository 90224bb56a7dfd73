"""Workers of the object-storage rank tests (``_workers.py _store_workers:<function>``): a save_dir on S3.

The S3 server runs in the test process; the ranks reach it through the
``AWS_ENDPOINT_URL`` and credentials its fixture put in the environment.
"""

from __future__ import annotations

import os
import signal

from pimm_fn import dist
from pimm_fn.checkpoint.formats import standard as _standard

import _workers


def train_dying(rank, world, out, *, save_dir, tag, step, victims):
    """``_workers.train``, with the ranks ``victims`` SIGKILLed inside the DCP write of ``step`` (their files written)."""
    if rank in victims:
        write_data = _standard._StoreWriter.write_data

        def dying(self, plan, planner):
            future = write_data(self, plan, planner)
            if f"/last-{step}-" in str(self.path):
                future.wait()
                print(f"rank {dist.rank()} dies inside the DCP write of step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return future

        _standard._StoreWriter.write_data = dying
    return _workers.train(rank, world, out, save_dir=save_dir, tag=tag)
