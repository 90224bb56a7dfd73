"""Weights that load with weights_only=True but are no state_dict are a damaged checkpoint, named, and skipped.

A genuine run's ``model.pth`` (standard) or the ``weights`` entry of its
``last.pth`` (legacy) is replaced by a list, or by a dict of strings and
numbers: every byte loads safely, yet nothing a model can load. Reading such
a checkpoint raises ``CheckpointError`` naming the file, so ``resume="auto"``
passes over it to the older intact checkpoint (before, torch's ``TypeError``
or ``RuntimeError`` came out of the resume, and ``auto`` aborted). Weights
that are a sound state_dict of another model stay the user's mismatch, not
damage.
"""

import json
import pathlib
import shutil
import sys

import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402

NOT_WEIGHTS = {
    "a list": ([1, 2], r"holds a list where a state_dict \(a dict of tensors\) is expected"),
    "strings and numbers": (
        {"hidden.weight": "x", "hidden.bias": 3},
        r"maps 'hidden.weight' to a str where a "
        r"state_dict holds a tensor",
    ),
    "a key that is no name": ({0: torch.ones(1)}, r"has a key 0 \(an int\) where a state_dict has names"),
    "nothing": (None, r"holds a NoneType"),
}


hooks = tw.snapshotting


@pytest.fixture(scope="module", params=["standard", "legacy"])
def saved(tmp_path_factory, request):
    """A finished 10-step run in each format: last (step 10), iter_4, iter_8, iter_10."""
    root = tmp_path_factory.mktemp(request.param)
    tw.finished(root / "run", request.param)
    return request.param, root / "run"


def copied(saved, tmp_path) -> pathlib.Path:
    run_dir = tmp_path / "run"
    shutil.copytree(saved[1], run_dir)
    return run_dir


def checkpoint_named(fmt: str, model_dir: pathlib.Path, name: str) -> pathlib.Path:
    return model_dir / (name if fmt == "standard" else f"{name}.pth")


def replace_weights(fmt: str, checkpoint: pathlib.Path, weights) -> str:
    """Write ``weights`` where the checkpoint keeps its weights (a new file: a snapshot's hard link keeps the genuine
    bytes; a standard checkpoint's COMPLETE records the new size). Returns the file as errors name it."""
    if fmt == "legacy":
        content = torch.load(checkpoint, weights_only=True)
        content["weights"] = weights
        checkpoint.unlink()
        torch.save(content, checkpoint)
        return checkpoint.name
    path = checkpoint / "model.pth"
    path.unlink()
    torch.save(weights, path)
    marker = json.loads((checkpoint / "COMPLETE").read_text())
    marker["files"]["model.pth"]["size"] = path.stat().st_size
    (checkpoint / "COMPLETE").unlink()
    (checkpoint / "COMPLETE").write_text(json.dumps(marker))
    return "model.pth"


@pytest.mark.parametrize("name", sorted(NOT_WEIGHTS))
def test_weights_that_are_no_state_dict_are_a_checkpoint_error_naming_the_file(saved, tmp_path, name):
    """load_checkpoint and a resume from the path raise CheckpointError naming model.pth (or the legacy file) and
    what it holds, before the model is touched (before: torch's TypeError or RuntimeError from the resume)."""
    fmt, _ = saved
    weights, says = NOT_WEIGHTS[name]
    last = checkpoint_named(fmt, copied(saved, tmp_path) / "model", "last")
    file = replace_weights(fmt, last, weights)
    with pytest.raises(pf.CheckpointError, match=says) as raised:
        load_checkpoint(find_checkpoint(last))
    assert raised.value.file == file and raised.value.path == str(last)
    with pytest.raises(pf.CheckpointError, match=says):
        tw.build(tmp_path / "again", hooks=hooks(), max_epochs=3, resume=str(last), fmt=fmt)


@pytest.mark.parametrize("name", ["a list", "strings and numbers"])
def test_auto_resume_skips_crafted_weights_for_the_older_intact_checkpoint(saved, tmp_path, capsys, name):
    """The two step-10 checkpoints with weights that are no state_dict: resume='auto' says it skips each, naming the
    weights file, and resumes iter_8, ending exactly as a resume of iter_8 does (before: the resume aborted)."""
    fmt, _ = saved
    model_dir = copied(saved, tmp_path) / "model"
    for checkpoint in ("last", "iter_10"):
        replace_weights(fmt, checkpoint_named(fmt, model_dir, checkpoint), NOT_WEIGHTS[name][0])
    file = "model.pth" if fmt == "standard" else "'weights' entry"  # a legacy file is named as the checkpoint
    model, run = tw.build(
        model_dir.parent,
        hooks=hooks(),
        max_epochs=3,
        resume="auto",
        fmt=fmt,
        console=True,
        watching=pf.Watching(progress=False),
    )
    skipped = [line for line in capsys.readouterr().out.splitlines() if "skipped checkpoint" in line]
    assert run.state.progress.global_step == 8
    assert len(skipped) == 2 and all(file in line for line in skipped), skipped
    run()
    trained = tw.weights(model)
    reference, again = tw.build(
        tmp_path / "ref",
        hooks=hooks(),
        max_epochs=3,
        fmt=fmt,  # one run at a time: one RNG
        resume=str(checkpoint_named(fmt, saved[1] / "model", "iter_8")),
    )
    again()
    assert tw.same_weights(trained, tw.weights(reference))


def test_a_sound_state_dict_of_another_model_is_no_damage(saved, tmp_path):
    """Tensors under other names are a state_dict: load_checkpoint reads them, and a resume into this model fails
    as the mismatch it is, not as a damaged checkpoint that 'auto' would skip."""
    fmt, _ = saved
    last = checkpoint_named(fmt, copied(saved, tmp_path) / "model", "last")
    replace_weights(fmt, last, {"other.weight": torch.ones(2, 4)})
    assert list(load_checkpoint(find_checkpoint(last)).weights) == ["other.weight"]
    with pytest.raises(
        pf.ResumeError,
        match=r"weights do not fit this run's TinyNet \(missing .*; unexpected other"
        r"\.weight\)\. Build the model the checkpoint was written with",
    ) as raised:
        tw.build(tmp_path / "again", hooks=hooks(), max_epochs=3, resume=str(last), fmt=fmt)
    assert not isinstance(raised.value, pf.CheckpointError)


def test_a_modules_extra_state_may_hold_plain_values_and_nothing_else_may(tmp_path):
    """A key ending in _extra_state (Module.get_extra_state) may be a plain value, and reads back; a plain value under
    any other name is refused when saving, so no checkpoint is written that a load would refuse as damaged."""
    weights = {"w": torch.ones(2), "norm._extra_state": 3, "head._extra_state": None}
    for fmt in ("standard", "legacy"):
        info = save_checkpoint(tmp_path / fmt, step=1, weights=weights, trainer={}, local={}, format=fmt)
        assert load_checkpoint(info).weights.keys() == weights.keys()
    with pytest.raises(TypeError, match=r"weights\['version'\] is a int; weights must map names to tensors"):
        save_checkpoint(tmp_path / "refused", step=1, weights={"w": torch.ones(2), "version": 3}, trainer={}, local={})
    assert not (tmp_path / "refused").exists()
