"""SHA-256 digests in the marker (``Saving(digests=True)``), checked on resume, warm start and ``verify``; marker paths confined.

A checkpoint is untrusted input: bytes changed at the same size are refused
wherever the marker records digests, and a marker naming anything but a
regular file inside its checkpoint directory is a damaged marker, never a
file to stat or open (``../../../dev/zero`` once made ``verify`` hang).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint import CheckpointError, load_weights_file, save_checkpoint, save_checkpoint_async, validate
from pimm_fn.checkpoint.discovery import candidates
from pimm_fn.checkpoint.files import digest
from pimm_fn.checkpoint.validation import confined
from pimm_fn.cli import DAMAGED, OK, main


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(128, 128)

    def forward(self, batch):
        return {"loss": self.layer(batch).pow(2).mean()}


def _loop(save_dir, *, resume=None, async_save=False, digests=True, max_epochs=1, console=False):
    torch.manual_seed(0)
    model = _Net()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        [torch.ones(2, 128)] * 4,
        hooks=[pf.save_every(2, snapshots=True, async_save=async_save)],
        max_epochs=max_epochs,
        save_dir=save_dir,
        resume=resume,
        saving=pf.Saving(digests=digests),
        watching=pf.Watching(console=console, progress=False),
    )


def _flip(path, count=16):
    """Flip ``count`` bytes in the middle of ``path``, in place: the same size, other bytes."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = bytes(b ^ 0xFF for b in data[middle : middle + count])
    with open(path, "r+b") as f:  # in place: a snapshot hard-linked to it sees the same bytes
        f.write(data)


def _cli(*args):
    """``python -m pimm_fn ARGS`` in a subprocess, bounded: a hang is a failure, not a stuck suite."""
    return subprocess.run(
        [sys.executable, "-m", "pimm_fn", *map(str, args)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def flipped(tmp_path):
    """A run saved with digests (last and iter_4 share model.pth; iter_2 intact) with 16 bytes of model.pth flipped."""
    _loop(tmp_path)()
    model_dir = tmp_path / "model"
    _flip(model_dir / "last" / "model.pth")
    return model_dir


# -- recording ------------------------------------------------------------------------------------
@pytest.mark.parametrize("async_save", [False, True])
def test_loop_digests_records_each_files_sha256(tmp_path, async_save):
    """loop(digests=True) records every file's SHA-256, sync or background save, and they match the bytes."""
    _loop(tmp_path, async_save=async_save)()
    for name in ("last", "iter_2"):
        checkpoint = tmp_path / "model" / name
        files = json.loads((checkpoint / "COMPLETE").read_text())["files"]
        assert "model.pth" in files and any(rel.startswith("trainer/") for rel in files)
        assert {rel: r["sha256"] for rel, r in files.items()} == {rel: digest(checkpoint / rel) for rel in files}


def test_digests_off_records_sizes_only_and_digests_must_be_a_bool(tmp_path):
    """digests=False records sizes and no digest; a non-bool is refused before anything is written."""
    _loop(tmp_path, digests=False)()
    files = json.loads((tmp_path / "model" / "last" / "COMPLETE").read_text())["files"]
    assert files and all(set(r) == {"size"} for r in files.values())
    with pytest.raises(TypeError, match="loop: 'digests' must be a bool"):
        _loop(tmp_path / "other", digests="yes")
    assert not (tmp_path / "other").exists()


def test_save_checkpoint_async_hashes_the_weights_file_as_written(tmp_path):
    """The background save's weights file digest (hashed while written) equals the file's."""
    weights = {"w": torch.randn(300, 300), "b": torch.arange(7)}
    info = save_checkpoint_async(
        tmp_path, step=3, weights=weights, trainer={"x": torch.ones(5)}, local={}, digests=True
    ).wait()
    files = json.loads((info.path / "COMPLETE").read_text())["files"]
    assert files["model.pth"]["sha256"] == digest(info.path / "model.pth")
    assert validate(info.path, digests=True) == info


# -- same-size corruption -------------------------------------------------------------------------
def test_same_size_corruption_passes_sizes_but_not_digests(flipped):
    """16 flipped bytes keep every size: the size check passes, the recorded digest does not."""
    last = flipped / "last"
    validate(last)
    with pytest.raises(CheckpointError, match="does not match the SHA-256") as caught:
        validate(last, digests=True)
    assert caught.value.file == "model.pth"


def test_verify_says_damaged_for_flipped_bytes(flipped):
    """`python -m pimm_fn verify` exits 1 (DAMAGED) naming model.pth and the digest; the intact snapshot is OK."""
    done = _cli("verify", flipped, "--json")
    assert done.returncode == 1, done.stderr
    status = {e["name"]: (e["status"], " ".join(e["problems"])) for e in json.loads(done.stdout)["entries"]}
    assert status["last"][0] == status["iter_4"][0] == "damaged"
    assert "model.pth" in status["last"][1] and "SHA-256" in status["last"][1]
    assert status["iter_2"][0] == "ok"


def test_auto_resume_refuses_the_flipped_checkpoint_and_takes_the_intact_one(flipped, capsys):
    """resume='auto' rejects last and iter_4 (their model.pth fails its digest) and resumes iter_2, saying why."""
    run = _loop(flipped.parent, resume="auto", max_epochs=2, console=True)
    assert run.state.progress.global_step == 2
    said = capsys.readouterr().out
    assert "skipped checkpoint" in said and "SHA-256" in said


def test_an_explicit_resume_of_the_flipped_checkpoint_raises(flipped):
    """resume=<path> of a checkpoint whose bytes fail their digest is a CheckpointError naming model.pth."""
    with pytest.raises(CheckpointError, match="model.pth does not match the SHA-256"):
        _loop(flipped.parent, resume=flipped / "last", max_epochs=2)


def test_a_warm_start_from_the_flipped_checkpoint_raises_before_training(flipped):
    """load_weights(<flipped checkpoint>) refuses model.pth, whose bytes fail their digest, and trains nothing."""
    torch.manual_seed(1)
    model = _Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        [torch.ones(2, 128)] * 2,
        hooks=[pf.load_weights(str(flipped / "last"))],
        max_epochs=1,
        watching=pf.Watching(console=False, progress=False),
    )
    with pytest.raises(CheckpointError, match="model.pth does not match the SHA-256") as caught:
        run()
    assert "load_weights" in str(caught.value)  # the advice names the warm start's way out too
    assert run.state.progress.global_step == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_load_weights_file_checks_the_digests_of_the_files_it_reads_only(flipped):
    """A checkpoint (or a model_dir whose newest is) with flipped weights raises; the intact snapshot loads; bytes
    changed in the optimizer state, which a weights load never reads, leave its weights loadable."""
    for path in (flipped / "last", flipped):
        with pytest.raises(CheckpointError, match="model.pth does not match the SHA-256"):
            load_weights_file(path)
    intact = flipped / "iter_2"
    assert set(load_weights_file(intact)) == {"layer.weight", "layer.bias"}
    data = sorted(p for p in (intact / "trainer").iterdir() if p.suffix == ".distcp")
    _flip(data[0])
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        validate(intact, digests=True)
    assert set(load_weights_file(intact)) == {"layer.weight", "layer.bias"}


# -- the best model ---------------------------------------------------------------------------------
def _best_run(save_dir, *, digests=True):
    """A run whose evaluation improves at steps 2 and 4: model_best.pth holds step 4's weights."""
    torch.manual_seed(0)
    model = _Net()
    scores = iter([1.0, 2.0])
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        [torch.ones(2, 128)] * 4,
        hooks=[pf.evaluate_every(2, lambda m: {"acc": next(scores)}), pf.best_on("acc")],
        max_epochs=1,
        save_dir=save_dir,
        saving=pf.Saving(digests=digests),
        watching=pf.Watching(console=False, progress=False),
    )
    run()
    return run, model


@pytest.mark.parametrize("digests", [True, False])
def test_the_best_model_record_holds_the_sha256_of_its_weights_only_with_digests(tmp_path, digests):
    _best_run(tmp_path, digests=digests)
    best = tmp_path / "model" / "model_best.pth"
    record = json.loads(best.with_suffix(".json").read_text())
    assert record["step"] == 4
    assert record.get("sha256") == (digest(best) if digests else None)


def test_a_best_model_whose_bytes_changed_is_refused_wherever_it_is_read(tmp_path):
    """run.test(weights="best"), a warm start from model_best.pth and `verify` refuse it; the model is untouched."""
    run, model = _best_run(tmp_path)
    best = tmp_path / "model" / "model_best.pth"
    _flip(best)
    own = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        CheckpointError,
        match="model_best.pth does not match the SHA-256 model_best.json records.*"
        "Restore it from a copy, or use a checkpoint's weights instead",
    ):
        run.test(lambda model: {"acc": 0.0}, weights="best")
    assert all(torch.equal(v, own[k]) for k, v in model.state_dict().items())
    with pytest.raises(CheckpointError, match="model_best.pth does not match the SHA-256"):
        load_weights_file(best)
    done = _cli("verify", tmp_path / "model", "--json")
    assert done.returncode == 1, done.stderr
    status = {e["name"]: (e["status"], " ".join(e["problems"])) for e in json.loads(done.stdout)["entries"]}
    assert status["model_best.pth"][0] == "damaged" and "SHA-256" in status["model_best.pth"][1]


def test_a_best_model_record_without_a_digest_or_unreadable_checks_nothing(tmp_path):
    """A best file written without digests, or whose .json is not a record, loads as before (its own read checks it)."""
    _best_run(tmp_path, digests=False)
    best = tmp_path / "model" / "model_best.pth"
    for text in ("[1, 2]", '{"sha256": 7}', "not json"):
        best.with_suffix(".json").write_text(text)
        assert set(load_weights_file(best)) == {"layer.weight", "layer.bias"}


# -- marker paths confined ------------------------------------------------------------------------
def _rewrite_marker(checkpoint, change):
    marker = json.loads((checkpoint / "COMPLETE").read_text())
    change(marker["files"])
    (checkpoint / "COMPLETE").write_text(json.dumps(marker))


@pytest.fixture
def crafted(tmp_path):
    """A model_dir whose last is intact and whose snapshots' markers name things outside or not regular files."""
    model_dir = tmp_path / "model"
    for step in (1, 2, 3, 4, 5):
        save_checkpoint(
            model_dir, step=step, weights={"w": torch.ones(64)}, trainer={}, local={}, snapshot=True, digests=True
        )
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * 12_345)
    _rewrite_marker(
        model_dir / "iter_1", lambda f: f.update({"../../../../../../../../dev/zero": {"size": 0, "sha256": "0" * 64}})
    )
    _rewrite_marker(model_dir / "iter_2", lambda f: f.update({str(outside): {"size": 12_345, "sha256": "0" * 64}}))
    moved = model_dir / "iter_3" / "model.pth"  # a link to a true copy of itself outside: same size, same bytes
    shutil.copy(moved, tmp_path / "copy.pth")
    moved.unlink()
    moved.symlink_to(tmp_path / "copy.pth")
    os.mkfifo(model_dir / "iter_4" / "pipe")  # reading a FIFO blocks forever
    _rewrite_marker(model_dir / "iter_4", lambda f: f.update({"pipe": {"size": 0, "sha256": "0" * 64}}))
    return model_dir


@pytest.mark.parametrize(
    "name, names", [("iter_1", "dev/zero"), ("iter_2", "outside.bin"), ("iter_3", "model.pth"), ("iter_4", "pipe")]
)
def test_a_marker_naming_anything_but_a_regular_file_inside_is_damaged(crafted, name, names):
    """`..`, an absolute path, a symbolic link and a FIFO make the marker damaged, with or without digests."""
    for digests in (False, True):
        with pytest.raises(CheckpointError, match=names) as caught:
            validate(crafted / name, digests=digests)
        assert caught.value.file == "COMPLETE"
    assert {c.path.name: c.error is None for c in candidates(crafted)}[name] is False


@pytest.mark.parametrize("rel", ["", ".", "a/../model.pth", "./model.pth", "/model.pth", "trainer//x", "a\\b", 7])
def test_confined_refuses_names_that_are_not_plain_relative_paths(tmp_path, rel):
    """Only a plain relative path names a file of a checkpoint."""
    (tmp_path / "model.pth").write_bytes(b"1")
    with pytest.raises(CheckpointError, match="not a plain relative path"):
        confined(tmp_path, rel)
    assert confined(tmp_path, "model.pth") == tmp_path / "model.pth"


def test_verify_and_ls_never_hang_or_stat_outside_on_crafted_markers(crafted, capsys):
    """`verify` of the model_dir ends (bounded subprocess), exit 1, each crafted snapshot damaged, last OK, and the
    outside file's size is printed nowhere; `ls` lists them without reading through the markers either."""
    done = _cli("verify", crafted, "--json")
    assert done.returncode == 1, done.stderr
    status = {e["name"]: e["status"] for e in json.loads(done.stdout)["entries"]}
    assert status["last"] == status["iter_5"] == "ok"
    assert all(status[f"iter_{s}"] == "damaged" for s in (1, 2, 3, 4))
    assert "12,345" not in done.stdout + done.stderr and "12345" not in done.stdout + done.stderr
    assert main(["ls", str(crafted)]) in (OK, DAMAGED)
    listed = capsys.readouterr().out
    assert "iter_1" in listed and "12,345" not in listed and "12 KB" not in listed.split("iter_2")[1].splitlines()[0]
