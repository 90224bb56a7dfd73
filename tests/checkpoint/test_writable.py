"""Storage that refuses writes: a save_dir a save cannot write is refused before the first step, and a write the
storage refuses during a save is a ``CheckpointStorageError`` naming the path and the fix, leaving nothing behind.

The refusal is the OS's own, for root too (``_disk_faults.unwritable``: the immutable flag); where the machine
cannot set it the tests are skipped, saying why. Several ranks: ``tests/distributed/test_unwritable_ranks.py``.
"""

import pathlib
import sys
import uuid

import pytest

import pimm_fn as pf
from pimm_fn.checkpoint import CheckpointStorageError
from pimm_fn.checkpoint import storage
from pimm_fn.checkpoint import files as writable

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "runtime"))
import _s3  # noqa: E402
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


def _entries(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("fmt", ["standard", "legacy"])
def test_a_model_dir_that_cannot_be_written_is_refused_before_the_first_step(run_dir, fmt):
    """loop() probes model/ (create, rename, delete) and raises naming rank 0, the path, the OS's reason and the
    fix; no step trains, the lock is released and nothing is left in save_dir."""
    model_dir = run_dir / "model"
    with unwritable(model_dir), pytest.raises(CheckpointStorageError) as raised:
        tw.build(run_dir, hooks=tw.snapshotting(), max_epochs=2, fmt=fmt)
    message = str(raised.value)
    assert message.startswith("save_dir cannot hold checkpoints: a save creates, renames and deletes"), message
    assert "rank 0 (host " in message and f"at {model_dir}: PermissionError" in message, message
    assert "trained no step" in message and f"Make {model_dir} {FIX}" in message, message
    assert _entries(run_dir) == ["model"] and _entries(model_dir) == []
    tw.build(run_dir, hooks=tw.snapshotting(), max_epochs=2, fmt=fmt)[1]()  # writable again: the run goes on
    assert pf.checkpoint.latest_checkpoint(model_dir).step == 10


def test_a_run_that_writes_nothing_is_not_probed(run_dir):
    """A finished run opened to be read (run.history) writes nothing, so an unwritable model/ does not stop it."""
    tw.build(run_dir, hooks=tw.snapshotting(), max_epochs=2)[1]()
    before = hashes(run_dir)
    with unwritable(run_dir / "model"), pytest.warns(pf.ConfigurationWarning, match="nothing is left to train"):
        _, run = tw.build(run_dir, hooks=tw.snapshotting(), max_epochs=2, resume="auto")
    assert run.finished and hashes(run_dir) == before


CASES = {  # the first write of step 8: (hooks, format, what the error names)
    "standard save": (lambda: [pf.save_every(4)], "standard", "the staging directory .staging-last-8"),
    "legacy save": (lambda: [pf.save_every(4)], "legacy", "last.pth"),
    "best model": (
        lambda: [pf.evaluate_every(4, tw.negative_mse, name="val"), pf.best_on("score"), pf.save_every(4)],
        "standard",
        "model_best.pth and model_best.json",
    ),
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


@pytest.fixture(scope="module")
def s3_endpoint():
    with _s3.s3_server() as endpoint:
        yield endpoint


def test_on_a_store_the_probe_is_an_object_written_and_deleted(s3_endpoint):
    """On S3 each rank's probe is a small object under model/, gone afterwards; a store that refuses it (here:
    no such bucket) is a CheckpointStorageError naming the place and the store's reason, and creates nothing."""
    save_dir = storage.location(f"s3://{_s3.new_bucket()}/run")
    writable.check_writable(save_dir, every_rank=True)
    assert (save_dir / "model").iterdir() == []
    missing = f"pimm-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(
        CheckpointStorageError,
        match=rf"save_dir cannot hold checkpoints: .* rank 0 \(host .*\) at "
        rf"s3://{missing}/run/model: FileNotFoundError",
    ):
        writable.check_writable(storage.location(f"s3://{missing}/run"), every_rank=True)
    assert not storage.location(f"s3://{missing}").bucket_exists()
