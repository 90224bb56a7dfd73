"""A save never deletes or overwrites a checkpoint it could not read where it writes: it sets it aside, kept.

One tiny run is saved once (``last/`` at step 10 and ``iter_4``, ``iter_8``,
``iter_10``, in either format); each case copies it, damages the copy and
trains on it. The store's case is ``tests/checkpoint/test_object_storage.py``.
A set-aside the storage refuses is real: the damaged checkpoint is made
immutable (``_disk_faults.unwritable``), which stops root too.
"""

import pathlib
import shutil
import sys
import warnings

import pytest

import pimm_fn as pf
from pimm_fn.checkpoint import discovery as candidates
from pimm_fn.checkpoint import inspection
from pimm_fn.checkpoint.validation import set_aside
from pimm_fn.checkpoint.errors import SetAsideWarning

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402
from _disk_faults import damage, hashes, unwritable, why_not_unwritable  # noqa: E402


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
    pf.checkpoint.save_checkpoint(
        model_dir, step=20, weights={"w": tw.torch.ones(1)}, trainer={}, local={}, snapshot=True, keep=pf.keep_last(1)
    )
    assert sorted(p.name for p in model_dir.glob("damaged-*")) == [
        "damaged-copy1",
        "damaged-copy1-2",
        "damaged-copy2",
        "damaged-iter_4",
    ]


REFUSED = {  # (format, the damaged entry the storage will not move, what the save of step 8 comes to)
    "last": (
        "standard",
        "last",
        "the checkpoint of step 8 is not published (its staging directory .staging-last-8 is removed)",
    ),
    "last.pth": ("legacy", "last.pth", "the checkpoint of step 8 is not published (nothing of it was written)"),
    "iter_8": (
        "standard",
        "iter_8",
        "the snapshot iter_8 is not made (its staging .staging-iter_8 is removed); the "
        "checkpoint itself was published as last, and is intact",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_set_aside_the_storage_refuses_loses_nothing_and_leaves_no_staging(finished_runs, tmp_path, case):
    """last, iter_10 and iter_8 damaged, resumed from iter_4; the storage refuses to move the damaged `case`: the
    save of step 8 raises CheckpointStorageError saying so, the damaged checkpoint is as it was, no .staging-* or
    damaged-* is left; once the storage allows it, the next run sets it aside as usual."""
    fmt, name, outcome = REFUSED[case]
    why = why_not_unwritable(tmp_path)
    if why:
        pytest.skip(why)
    run_dir = _copy(finished_runs, tmp_path, fmt)
    model_dir = run_dir / "model"
    suffix = ".pth" if fmt == "legacy" else ""
    for damaged in ("last", "iter_10", "iter_8"):
        path = model_dir / f"{damaged}{suffix}"
        damage(path if fmt == "legacy" else _data_file(path), "truncate")
    refused = model_dir / name
    kept = hashes(model_dir / name) if refused.is_dir() else refused.read_bytes()
    with unwritable(refused), pytest.raises(pf.checkpoint.CheckpointStorageError) as raised:
        _trained(run_dir, resume="auto", fmt=fmt)
    message = str(raised.value)
    assert message.startswith(f"checkpoint {refused}: "), message
    assert f"so that checkpoint was to be kept as damaged-{name}, which the storage refused (PermissionError" in message
    assert f"it is left as it was, and {outcome}. Move {refused} out of the way yourself" in message, message
    assert (hashes(refused) if refused.is_dir() else refused.read_bytes()) == kept
    assert not list(model_dir.glob(".staging-*")) and not (model_dir / f"damaged-{name}").exists()
    if case == "iter_8":
        assert pf.checkpoint.validate(model_dir / "last").step == 8
    said = _trained(run_dir, resume="auto", fmt=fmt)  # resumes iter_4 again, or (iter_8's case) the new last
    if case == "iter_8":  # no later save writes iter_8: it stays, damaged, where it is
        assert not said and hashes(refused) == kept
        return
    assert any(f"kept as damaged-{name}" in str(w.message) for w in said)
    kept_aside = model_dir / f"damaged-{name}"
    assert (hashes(kept_aside) if kept_aside.is_dir() else kept_aside.read_bytes()) == kept
