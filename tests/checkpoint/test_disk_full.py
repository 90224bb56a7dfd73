"""A save that runs out of space says so, leaves the last checkpoint and model_best whole, and resume continues exactly.

The full disk is injected where the OS reports it (``_disk_faults``: each
``write`` to the chosen file raises ``OSError(ENOSPC)``), at each file a save
or a best-model write writes, for synchronous, background and legacy saves.
"Space returns" when the injection ends; ``resume="auto"`` must then reach
the same final weights, bit for bit, as a run that never failed.
"""

import errno
import hashlib
import json
import pathlib
import sys

import pytest
import torch

import pimm_fn as pf
from pimm_fn import checkpoint
from pimm_fn.checkpoint import DiskFullError

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402
from _disk_faults import full_disk  # noqa: E402

MODES = {"sync": dict(), "async": dict(async_save=True), "legacy": dict()}
CASES = [
    ("sync", site)
    for site in ("model.pth", "__0_0.distcp", ".metadata", "COMPLETE", "model_best.pth", "model_best.json")
]
CASES += [("async", site) for site in ("model.pth", "__0_0.distcp", ".metadata", "COMPLETE")]
CASES += [("legacy", "last.pth")]


def hooks(mode):
    return [pf.evaluate_every(4, tw.negative_mse, name="val"), pf.save_every(4, **MODES[mode]), pf.best_on("score")]


def build(save_dir, mode, **kwargs):
    return tw.build(
        save_dir, hooks=hooks(mode), max_epochs=3, fmt="legacy" if mode == "legacy" else "standard", **kwargs
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Each mode's final weights after an uninterrupted run."""
    found = {}
    for mode in MODES:
        model, run = build(tmp_path_factory.mktemp(mode), mode)
        run()
        found[mode] = tw.weights(model)
    return found


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("mode, site", CASES)
def test_a_full_disk_is_named_and_resume_continues_bit_identical(reference, tmp_path, mode, site):
    """ENOSPC at `site` raises DiskFullError naming the directory and bytes; staging gone, old files whole, resume exact."""
    model_dir = tmp_path / "model"
    _, run = build(tmp_path, mode)
    run.run(steps=5)  # the checkpoint and model_best of step 4 are written
    run.ctx.wait_for_save()
    best = {p.name: digest(p) for p in model_dir.glob("model_best*")}
    with full_disk(model_dir, site) as hits, pytest.raises(DiskFullError) as caught:
        run.run()
    message = str(caught.value)
    assert hits, f"no write to {site} was refused"
    assert caught.value.errno == errno.ENOSPC and isinstance(caught.value, OSError)
    assert "No space left on device" in message and str(model_dir) in message and " bytes)" in message, message
    assert caught.value.nbytes > 0, message
    assert not list(model_dir.glob(".staging-*")), sorted(p.name for p in model_dir.iterdir())
    if site.startswith("model_best"):  # the write that failed leaves the previous best as it was
        assert {p.name: digest(p) for p in model_dir.glob("model_best*")} == best
    assert json.loads((model_dir / "model_best.json").read_text())["step"] >= 4  # whole, either way
    torch.load(model_dir / "model_best.pth", weights_only=True)
    latest = checkpoint.latest_checkpoint(model_dir)
    assert latest.step == 4 or site.startswith("model_best"), latest
    checkpoint.load_checkpoint(latest)
    model, resumed = build(tmp_path, mode, resume="auto")  # the space is back
    resumed()
    assert tw.same_weights(tw.weights(model), reference[mode])


def test_a_failed_best_write_leaves_no_temporary_file_and_the_old_best(tmp_path):
    """write_best out of space keeps model_best.pth/.json as they were and leaves no .staging-* file behind."""
    checkpoint.write_best(tmp_path, {"w": torch.zeros(4)}, metric="m", value=1.0, step=1)
    before = {p.name: digest(p) for p in tmp_path.iterdir()}
    with (
        full_disk(tmp_path, "model_best.json"),
        pytest.raises(DiskFullError, match="the previous model_best is intact"),
    ):
        checkpoint.write_best(tmp_path, {"w": torch.ones(4)}, metric="m", value=2.0, step=2)
    assert {p.name: digest(p) for p in tmp_path.iterdir()} == before
