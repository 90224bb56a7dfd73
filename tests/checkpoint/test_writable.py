"""Storage that refuses writes: a write the storage refuses during a save is a ``CheckpointStorageError`` naming
the path and the fix, leaving nothing behind.

The refusal is the OS's own, for root too (``_disk_faults.unwritable``: the immutable flag); where the machine
cannot set it the tests are skipped, saying why.
"""

import pathlib
import sys

import pytest

import pimm_fn as pf
from pimm_fn.checkpoint import CheckpointStorageError

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "runtime"))
import _tiny_workload as tw  # noqa: E402
from _disk_faults import hashes, unwritable, why_not_unwritable  # noqa: E402

FIX = "writable by this user on every node"


@pytest.fixture
def run_dir(tmp_path):
    """A save_dir whose ``model/`` exists (empty), on a machine that can make it unwritable."""
    why = why_not_unwritable(tmp_path)
    if why:
        pytest.skip(why)
    (tmp_path / "run" / "model").mkdir(parents=True)
    return tmp_path / "run"


CASES = {  # the first write of step 8: (hooks, format, what the error names)
    "standard save": (lambda: [pf.save_every(4)], "standard", "the staging directory .staging-last-8"),
    "legacy save": (lambda: [pf.save_every(4)], "legacy", "last.pth"),
    "best model": (lambda: [pf.evaluate_every(4, tw.negative_mse, name="val"), pf.best_on("score"), pf.save_every(4)],
                   "standard", "model_best.pth and model_best.json"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_write_the_storage_refuses_during_training_is_a_storage_error_with_the_path_and_the_fix(run_dir, case):
    """model/ made unwritable after the check: the save (or best-model write) of step 8 raises CheckpointStorageError
    naming model/, the OS's reason and the fix; what step 4 wrote is kept, and resume='auto' continues from it."""
    hooks, fmt, what = CASES[case]
    model_dir = run_dir / "model"
    _, run = tw.build(run_dir, hooks=hooks(), fmt=fmt)
    run.run(steps=5)  # step 4 wrote
    kept = hashes(model_dir)
    with unwritable(model_dir), pytest.raises(CheckpointStorageError) as raised:
        run.run(steps=5)
    message = str(raised.value)
    assert f"writing {what} under {model_dir} failed: PermissionError: [Errno 1] Operation not permitted" in message
    assert f"Make {model_dir} {FIX}" in message and "resume='auto'" in message, message
    assert hashes(model_dir) == kept and not list(model_dir.glob(".staging-*"))
    del run
    _, resumed = tw.build(run_dir, hooks=hooks(), fmt=fmt, resume="auto")
    resumed()
    assert resumed.state.progress.global_step == 15
