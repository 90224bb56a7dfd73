"""Discovery finds the newest complete checkpoint and never an unfinished one."""

import json
import os
import shutil

import pytest
import torch

from pimm_fn.checkpoint import find_checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint


def _save(model_dir, step, **kw):
    return save_checkpoint(
        model_dir, step=step, weights={"w": torch.full((2,), float(step))}, trainer={"step": step}, local={"r": 0}, **kw
    )


def test_empty_or_missing_dir_has_no_checkpoint(tmp_path):
    """No directory, or an empty one, means no checkpoint."""
    assert latest_checkpoint(tmp_path / "absent") is None
    assert latest_checkpoint(tmp_path) is None


def test_highest_complete_step_wins_and_last_wins_ties(tmp_path):
    """Among last/, iter_*/ and legacy files the highest step wins; on a tie, last/."""
    _save(tmp_path, 5, snapshot=True)
    _save(tmp_path, 9, format="legacy", snapshot=True)
    _save(tmp_path, 8)
    info = latest_checkpoint(tmp_path)
    assert (info.path.name, info.step, info.format) == ("last.pth", 9, "legacy")
    _save(tmp_path, 9, snapshot=True)
    info = latest_checkpoint(tmp_path)
    assert (info.path.name, info.step, info.format) == ("last", 9, "standard")


def test_partial_staging_dir_is_never_discovered_and_is_cleaned(tmp_path):
    """A staging dir from a crash mid-write is ignored, then removed by the next save."""
    _save(tmp_path, 1)
    staging = tmp_path / ".staging-last-2"
    shutil.copytree(tmp_path / "last", staging)  # everything, even a marker claiming step 1
    (staging / "trainer" / ".metadata").unlink()
    assert latest_checkpoint(tmp_path).path == tmp_path / "last"
    _save(tmp_path, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_crash_between_renames_keeps_previous_checkpoint(tmp_path, same):
    """After `last` -> `.retired-last-1` but before staging -> `last`, step 1 is still found and loads."""
    _save(tmp_path, 1)
    os.rename(tmp_path / "last", tmp_path / ".retired-last-1")
    half = tmp_path / ".staging-last-2"
    (half / "trainer").mkdir(parents=True)
    (half / "trainer" / "__0_0.distcp").write_bytes(b"\0" * 10)
    info = latest_checkpoint(tmp_path)
    assert (info.path.name, info.step) == (".retired-last-1", 1)
    same(load_checkpoint(info).trainer, {"step": 1})
    _save(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    assert latest_checkpoint(tmp_path).step == 2


@pytest.mark.parametrize("damage", ["no_marker", "bad_json", "wrong_version", "no_weights", "no_metadata"])
def test_damaged_dirs_are_skipped(tmp_path, damage):
    """A dir whose marker is missing/invalid or whose files are gone is not a checkpoint."""
    _save(tmp_path, 1, snapshot=True)
    _save(tmp_path, 2)
    last = tmp_path / "last"
    if damage == "no_marker":
        (last / "COMPLETE").unlink()
    elif damage == "bad_json":
        (last / "COMPLETE").write_text("{step")
    elif damage == "wrong_version":
        (last / "COMPLETE").write_text(json.dumps({"step": 2, "format": "standard", "world_size": 1, "version": 9}))
    elif damage == "no_weights":
        (last / "model.pth").unlink()
    else:
        (last / "trainer" / ".metadata").unlink()
    assert latest_checkpoint(tmp_path).path == tmp_path / "iter_1"
    with pytest.raises(ValueError, match=str(last)):
        find_checkpoint(last)


def test_truncated_legacy_file_is_skipped(tmp_path):
    """A legacy file that does not load is ignored by discovery and named by find_checkpoint."""
    _save(tmp_path, 1, format="legacy", snapshot=True)
    data = (tmp_path / "iter_1.pth").read_bytes()
    _save(tmp_path, 2, format="legacy")
    (tmp_path / "last.pth").unlink()
    (tmp_path / "last.pth").write_bytes(data[: len(data) // 2])
    assert latest_checkpoint(tmp_path).path == tmp_path / "iter_1.pth"
    with pytest.raises(ValueError, match="weights_only"):
        find_checkpoint(tmp_path / "last.pth")


def test_find_checkpoint_resolves_dirs_files_and_save_dirs(tmp_path):
    """A checkpoint dir, a legacy file, a model_dir and a save_dir all resolve."""
    model_dir = tmp_path / "model"
    _save(model_dir, 4, snapshot=True)
    _save(model_dir, 6, format="legacy")
    assert find_checkpoint(model_dir / "iter_4").step == 4
    assert find_checkpoint(model_dir / "last.pth").format == "legacy"
    assert find_checkpoint(model_dir).step == 6
    assert find_checkpoint(tmp_path).path == model_dir / "last.pth"


def test_find_checkpoint_errors_name_the_path(tmp_path):
    """Missing paths, empty dirs, unfinished dirs and foreign files each get a clear error."""
    with pytest.raises(FileNotFoundError, match="does not exist; expected"):
        find_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint under"):
        find_checkpoint(tmp_path)
    staging = tmp_path / ".staging-last-3"
    (staging / "trainer").mkdir(parents=True)
    with pytest.raises(ValueError, match="no COMPLETE marker"):
        find_checkpoint(staging)
    foreign = tmp_path / "weights.pth"
    torch.save({"w": torch.ones(1)}, foreign)
    with pytest.raises(ValueError, match="not a legacy checkpoint"):
        find_checkpoint(foreign)


def test_checkpoint_written_by_more_ranks_gives_local_none_past_them(tmp_path):
    """Reading rank-local state for a rank the checkpoint lacks yields None, not an error."""
    from pimm_fn.checkpoint.formats import standard as _standard

    _save(tmp_path, 1)
    trainer, local = _standard.read_trainer(tmp_path / "last", rank=3)
    assert trainer == {"step": 1} and local is None
