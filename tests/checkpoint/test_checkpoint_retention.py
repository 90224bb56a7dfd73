"""Snapshots (iter_<step>) and keep_snapshots retention."""

import os

import pytest
import torch

from pimm_fn.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint


def _save(model_dir, step, **kw):
    return save_checkpoint(
        model_dir, step=step, weights={"w": torch.full((2,), float(step))}, trainer={"step": step}, local={}, **kw
    )


@pytest.mark.parametrize("fmt, name", [("standard", "iter_{}"), ("legacy", "iter_{}.pth")])
def test_snapshots_are_complete_and_survive_later_saves(tmp_path, fmt, name):
    """Each snapshot loads its own step after `last` moved on."""
    for step in (10, 20, 30):
        _save(tmp_path, step, format=fmt, snapshot=True)
    for step in (10, 20, 30):
        loaded = load_checkpoint(find_checkpoint(tmp_path / name.format(step)))
        assert loaded.trainer == {"step": step} and loaded.weights["w"][0].item() == step


def test_standard_snapshot_uses_hard_links(tmp_path):
    """A snapshot shares file data with the published `last/` instead of copying it."""
    _save(tmp_path, 5, snapshot=True)
    assert os.path.samefile(tmp_path / "last" / "model.pth", tmp_path / "iter_5" / "model.pth")


@pytest.mark.parametrize("fmt", ["standard", "legacy"])
def test_keep_snapshots_deletes_oldest_beyond_n(tmp_path, fmt):
    """keep_snapshots=2 leaves exactly the two newest snapshots, and `last` untouched."""
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, format=fmt, snapshot=True, keep_snapshots=2)
    suffix = "" if fmt == "standard" else ".pth"
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([f"iter_3{suffix}", f"iter_4{suffix}", "last" + suffix])


def test_resaving_same_step_replaces_its_snapshot(tmp_path):
    """Saving step k again (after a resume) overwrites iter_k instead of failing."""
    _save(tmp_path, 3, snapshot=True)
    save_checkpoint(tmp_path, step=3, weights={"w": torch.zeros(2)}, trainer={"again": True}, local={}, snapshot=True)
    assert load_checkpoint(find_checkpoint(tmp_path / "iter_3")).trainer == {"again": True}
