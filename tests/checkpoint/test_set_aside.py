"""A save never deletes or overwrites a checkpoint it could not read where it writes: it sets it aside, kept.

One tiny run is saved once (``last/`` at step 10 and ``iter_4``, ``iter_8``,
``iter_10``, in either format); each case copies it, damages the copy and
trains on it. The store's case is ``tests/checkpoint/test_object_storage.py``.
"""

import pathlib
import shutil
import sys
import warnings

import pytest

import pimm_fn as pf
from pimm_fn.checkpoint import candidates, inspection
from pimm_fn.checkpoint.set_aside import SetAsideWarning, set_aside

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402
from _disk_faults import damage, hashes  # noqa: E402


hooks = tw.snapshotting


def _copy(finished_runs, tmp_path, fmt="standard") -> pathlib.Path:
    run_dir = tmp_path / "run"
    shutil.copytree(finished_runs / fmt, run_dir)
    return run_dir


def _trained(run_dir, *, resume, fmt="standard") -> list:
    """Train to the end of 3 epochs (15 steps) in ``run_dir``; returns the set-aside warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tw.build(run_dir, hooks=hooks(), max_epochs=3, resume=resume, fmt=fmt)[1]()
    return [w for w in caught if issubclass(w.category, SetAsideWarning)]


def _data_file(checkpoint: pathlib.Path) -> pathlib.Path:
    return next(p for p in (checkpoint / "trainer").iterdir() if p.suffix == ".distcp")


def test_auto_resume_past_a_damaged_last_and_snapshot_sets_them_aside_when_it_saves_there(finished_runs, tmp_path):
    """last/, iter_10 and iter_8 cut short: resume='auto' takes iter_4; its save of step 8 takes the names iter_8
    and last, whose damaged checkpoints are kept, byte for byte, as damaged-iter_8 and damaged-last, each said
    once; iter_10, whose name no later save takes, is left as it is."""
    run_dir = _copy(finished_runs, tmp_path)
    model_dir = run_dir / "model"
    for name in ("last", "iter_10", "iter_8"):
        damage(_data_file(model_dir / name), "truncate")
    kept = {name: hashes(model_dir / name) for name in ("last", "iter_10", "iter_8")}
    said = _trained(run_dir, resume="auto")
    assert sorted(str(w.message).split(": a save writes ")[1].split(" ")[0] for w in said) == ["iter_8", "last"]
    assert all("never deleted" in str(w.message) and "verify" in str(w.message) for w in said)
    for name in ("last", "iter_8"):
        assert hashes(model_dir / f"damaged-{name}") == kept[name]
        assert pf.checkpoint.validate(model_dir / name).step == (15 if name == "last" else 8)
    assert hashes(model_dir / "iter_10") == kept["iter_10"]


def test_a_fresh_run_sets_aside_a_damaged_last_instead_of_replacing_it(finished_runs, tmp_path):
    """With only a damaged last/ (its marker lost) a fresh run starts (nothing intact to refuse for) and keeps it."""
    run_dir = _copy(finished_runs, tmp_path)
    model_dir = run_dir / "model"
    for snapshot in model_dir.glob("iter_*"):
        shutil.rmtree(snapshot)
    (model_dir / "last" / "COMPLETE").unlink()
    kept = hashes(model_dir / "last")
    (said,) = _trained(run_dir, resume=None)
    assert "COMPLETE is missing" in str(said.message)
    assert hashes(model_dir / "damaged-last") == kept
    assert pf.checkpoint.validate(model_dir / "last").step == 15


def test_a_damaged_legacy_last_and_snapshot_are_set_aside_not_replaced(finished_runs, tmp_path):
    """The one-file format: a garbled last.pth and iter_8.pth are kept as damaged-last.pth and damaged-iter_8.pth."""
    run_dir = _copy(finished_runs, tmp_path, "legacy")
    model_dir = run_dir / "model"
    for name in ("last.pth", "iter_10.pth", "iter_8.pth"):
        damage(model_dir / name, "garbage")
    kept = {name: (model_dir / name).read_bytes() for name in ("last.pth", "iter_8.pth")}
    assert len(_trained(run_dir, resume="auto", fmt="legacy")) == 2
    for name, data in kept.items():
        assert (model_dir / f"damaged-{name}").read_bytes() == data
        assert pf.checkpoint.validate(model_dir / name).step == (15 if name == "last.pth" else 8)


def test_set_aside_names_never_collide_and_discovery_and_retention_never_see_them(finished_runs, tmp_path):
    """A second damaged last/ becomes damaged-last-2; discovery skips both, ls lists them as set aside and damaged,
    and retention keeping one snapshot leaves them alone."""
    run_dir = _copy(finished_runs, tmp_path)
    model_dir = run_dir / "model"
    for n in (1, 2):
        copy = model_dir / f"copy{n}"
        shutil.copytree(model_dir / "last", copy)
        damage(_data_file(copy), "truncate")
        set_aside(copy)
    assert sorted(p.name for p in model_dir.glob("damaged-*")) == ["damaged-copy1", "damaged-copy2"]
    again = model_dir / "copy1"
    shutil.copytree(model_dir / "last", again)
    assert set_aside(again).name == "damaged-copy1-2"
    assert not any(c.path.name.startswith("damaged-") for c in candidates.candidates(model_dir))
    assert inspection.kind_of(model_dir / "damaged-copy1-2") == ("set aside", None)
    shutil.copytree(model_dir / "iter_4", model_dir / "damaged-iter_4")
    assert inspection.kind_of(model_dir / "damaged-iter_4") == ("set aside", 4)
    pf.checkpoint.save_checkpoint(model_dir, step=20, weights={"w": tw.torch.ones(1)}, trainer={}, local={},
                                  snapshot=True, keep=pf.keep_last(1))
    assert sorted(p.name for p in model_dir.glob("damaged-*")) == [
        "damaged-copy1", "damaged-copy1-2", "damaged-copy2", "damaged-iter_4"]
