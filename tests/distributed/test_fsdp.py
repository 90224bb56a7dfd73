"""A sharded (FSDP2) model: its checkpoints keep shards through DCP, resume exactly, and reshard to another world size."""

import shutil

import pytest
import torch

from _launch import results, run_ranks

pytestmark = pytest.mark.distributed

SAVED_AT = 5  # mid-epoch on 2 ranks (6 steps per epoch) and on 1 (12)


def _launch(out, tag, world, **kwargs):
    run_ranks("_fsdp_workers:train", world, out, timeout=120, tag=tag, **kwargs).check()
    return results(out, tag, world)[0]  # rank 0 holds the gathered state


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _close(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Whole FSDP2 runs on 2 ranks, one per optimizer, and their checkpoints of step 5 (snapshots of the directory)."""
    out = tmp_path_factory.mktemp("fsdp")
    found = {}
    for optim in ("sgd", "adam"):
        partial = out / f"partial-{optim}"
        saved = _launch(out, f"saved-{optim}", 2, save_dir=str(partial), optim=optim, steps=SAVED_AT)
        whole = _launch(out, f"whole-{optim}", 2, save_dir=str(out / f"whole-{optim}"), optim=optim)
        found[optim] = (partial, saved, whole)
    return found


@pytest.mark.parametrize("optim", ["sgd", "adam"])
def test_fsdp2_resume_on_the_same_world_size_is_bit_identical(uninterrupted, tmp_path, optim):
    partial, saved, whole = uninterrupted[optim]
    run_dir = tmp_path / "run"
    shutil.copytree(partial, run_dir)
    resumed = _launch(tmp_path, "resumed", 2, save_dir=str(run_dir), optim=optim, resume="auto")
    assert _equal(resumed["restored"], saved["final"])
    assert _equal(resumed["final"], whole["final"])
    assert resumed["trace"] == [t for t in whole["trace"]][len(saved["trace"]) :]
    assert resumed["progress"] == whole["progress"]


def test_fsdp2_weights_file_is_the_full_state_dict_anyone_can_load(uninterrupted):
    partial, saved, _ = uninterrupted["adam"]
    weights = torch.load(partial / "model" / "last" / "model.pth", weights_only=True)
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        "body.0.weight": (16, 8),
        "body.0.bias": (16,),
        "body.2.weight": (1, 16),
        "body.2.bias": (1,),
    }
    assert _equal(weights, saved["final"]["weights"])
    best = torch.load(partial / "model" / "model_best.pth", weights_only=True)
    assert all(type(v) is torch.Tensor for v in best.values()) and best["body.0.weight"].shape == (16, 8)


@pytest.fixture(scope="module")
def saved_by(uninterrupted, tmp_path_factory):
    """Checkpoints of step 5 by FSDP2 and by DDP, on 2 ranks and on 1, per optimizer: (run dir, gathered state)."""
    out = tmp_path_factory.mktemp("saved")
    found = {}
    for optim in ("sgd", "adam"):
        partial, saved, _ = uninterrupted[optim]
        found["fsdp", 2, optim] = (partial, saved)
        for kind, world in (("fsdp", 1), ("ddp", 1), ("ddp", 2)):
            run_dir = out / f"{kind}{world}-{optim}"
            tag = f"{kind}{world}-{optim}"
            found[kind, world, optim] = (
                run_dir,
                _launch(out, tag, world, save_dir=str(run_dir), optim=optim, kind=kind, steps=SAVED_AT),
            )
    return found


@pytest.mark.parametrize("optim", ["sgd", "adam"])
@pytest.mark.parametrize("old, new", [(2, 1), (1, 2)])
def test_fsdp2_resume_on_another_world_size_reshards_and_trains_as_a_run_that_changed_size_there(
    saved_by, tmp_path, optim, old, new
):
    """Restored bit for bit; then equal within float tolerance to a DDP run that changed size at the same step."""
    results_by_kind = {}
    for kind in ("fsdp", "ddp"):
        partial, saved = saved_by[kind, old, optim]
        run_dir = tmp_path / kind
        shutil.copytree(partial, run_dir)
        resumed = _launch(tmp_path, kind, new, save_dir=str(run_dir), optim=optim, kind=kind, resume="auto")
        assert _equal(resumed["restored"], saved["final"]), kind
        results_by_kind[kind] = resumed
    fsdp, ddp = results_by_kind["fsdp"], results_by_kind["ddp"]
    assert _close(fsdp["final"], ddp["final"])
    assert fsdp["progress"] == ddp["progress"] and fsdp["trace"] == ddp["trace"]


def test_fsdp2_background_saves_on_two_ranks_resume_bit_identical(uninterrupted, tmp_path):
    _, _, whole = uninterrupted["adam"]
    run_dir = tmp_path / "run"
    _launch(tmp_path, "partial", 2, save_dir=str(run_dir), async_save=True, steps=SAVED_AT)
    resumed = _launch(tmp_path, "resumed", 2, save_dir=str(run_dir), async_save=True, resume="auto")
    assert resumed["restored_progress"].global_step == SAVED_AT
    assert _equal(resumed["final"], whole["final"])
