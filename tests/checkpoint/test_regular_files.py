"""Small files under a save_dir are untrusted: read only when regular, never waited on, never a RecursionError.

A FIFO in place of ``COMPLETE`` once made ``resume="auto"`` wait forever,
and ``"[" * 100000`` made it abort with a ``RecursionError`` instead of
skipping to an older checkpoint. Each block that could wait runs under a
deadline: a regression fails the test instead of hanging pytest.
"""

import json
import os
import pathlib
import sys

import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint import CheckpointError, load_weights_file, save_checkpoint, validate, write_best
from pimm_fn.checkpoint import files as regular_files
from pimm_fn.checkpoint.files import digest
from pimm_fn.checkpoint.files import read_bytes, read_json, read_text
from pimm_fn.checkpoint.errors import NotRegularFileError
from pimm_fn.checkpoint.validation import read_marker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _stuck import within  # noqa: E402

DEEP = {"list": "[" * 100000, "object": '{"a":' * 100000}


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, batch):
        return {"loss": self.layer(batch).pow(2).mean()}


def _run(save_dir, *, resume=None, max_epochs=1, console=False):
    torch.manual_seed(0)
    model = _Net()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        [torch.ones(2, 4)] * 4,
        hooks=[pf.save_every(2, snapshots=True)],
        max_epochs=max_epochs,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=console, progress=False),
    )


# -- the readers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("read", [read_bytes, read_text, read_json, digest, regular_files.open_regular])
def test_a_fifo_is_refused_at_once_never_waited_on(tmp_path, read):
    """Every reader refuses a FIFO without opening it for a read that would wait for a writer."""
    fifo = tmp_path / "COMPLETE"
    os.mkfifo(fifo)
    with within(10), pytest.raises(NotRegularFileError, match="is a FIFO, not a regular file"):
        read(fifo)


def test_a_symbolic_link_is_never_followed_even_to_a_good_file(tmp_path):
    """A link to a valid JSON file is refused as a link: nothing outside the checkpoint is read through it."""
    (tmp_path / "elsewhere.json").write_text('{"ok": 1}')
    (tmp_path / "model_best.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(NotRegularFileError, match="is a symbolic link"):
        read_json(tmp_path / "model_best.json")
    with pytest.raises(NotRegularFileError, match="is a symbolic link"):
        digest(tmp_path / "model_best.json")


@pytest.mark.parametrize("where, kind", [("dir", "a directory"), ("/dev/zero", "a character device")])
def test_a_directory_or_a_device_is_refused_unopened(tmp_path, where, kind):
    """A directory or /dev/zero (endless bytes) is refused by what it is, before any read."""
    path = tmp_path / "d" if where == "dir" else where
    if where == "dir":
        path.mkdir()
    with within(10), pytest.raises(NotRegularFileError, match=f"is {kind}, not a regular file"):
        read_bytes(path)


@pytest.mark.parametrize("shape", sorted(DEEP))
def test_json_nested_too_deeply_is_a_value_error_not_a_recursion_error(tmp_path, shape):
    """100,000 nested brackets (a crafted file) are malformed JSON like any other: a ValueError saying so."""
    path = tmp_path / "COMPLETE"
    path.write_text(DEEP[shape])
    with pytest.raises(ValueError, match="nested too deeply to parse"):
        read_json(path)


def test_a_file_over_the_limit_is_refused_and_one_at_the_limit_is_read(tmp_path):
    """At most ``limit`` bytes are read: one byte more is a ValueError, not a file read to the end."""
    path = tmp_path / "f"
    path.write_bytes(b"1234567890")
    assert read_bytes(path, limit=10) == b"1234567890" and read_json(path, limit=10) == 1234567890
    with pytest.raises(ValueError, match="over 9 bytes"):
        read_bytes(path, limit=9)


def test_a_missing_file_is_file_not_found_and_bad_utf8_a_value_error(tmp_path):
    """A missing file is FileNotFoundError (callers treat it as absent); undecodable bytes are a ValueError."""
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "nothing")
    (tmp_path / "bad").write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(ValueError):
        read_text(tmp_path / "bad")


# -- the COMPLETE marker ---------------------------------------------------------------------------
@pytest.fixture
def checkpoint(tmp_path):
    """A standard checkpoint written by save_checkpoint (its ``last`` directory)."""
    save_checkpoint(tmp_path / "ckpt", step=3, weights={"w": torch.ones(4)}, trainer={}, local={})
    return tmp_path / "ckpt" / "last"


@pytest.mark.parametrize("damage", ["fifo", "link", *sorted(DEEP)])
def test_a_crafted_marker_is_a_checkpoint_error_naming_complete(checkpoint, damage):
    """A FIFO, a link or too deep JSON as COMPLETE is a CheckpointError naming the checkpoint, the file and why."""
    marker = checkpoint / "COMPLETE"
    good = marker.read_text()
    marker.unlink()
    if damage == "fifo":
        os.mkfifo(marker)
    elif damage == "link":
        (checkpoint.parent / "elsewhere").write_text(good)
        marker.symlink_to(checkpoint.parent / "elsewhere")
    else:
        marker.write_text(DEEP[damage])
    expected = {"fifo": "is a FIFO, not a regular file", "link": "is a symbolic link, not a regular file"}
    with within(20), pytest.raises(CheckpointError) as caught:
        read_marker(checkpoint)
    assert caught.value.file == "COMPLETE" and caught.value.path == str(checkpoint)
    assert expected.get(damage, "is not valid JSON (nested too deeply to parse)") in caught.value.problem
    with within(20), pytest.raises(CheckpointError, match="COMPLETE"):
        validate(checkpoint)


@pytest.mark.parametrize("damage", ["fifo", *sorted(DEEP)])
def test_resume_auto_skips_a_last_whose_marker_is_a_fifo_or_too_deep(tmp_path, damage, capsys):
    """resume='auto' says why last is skipped and resumes the older intact snapshot, neither waiting nor aborting."""
    _run(tmp_path)()
    marker = tmp_path / "model" / "last" / "COMPLETE"
    marker.unlink()
    if damage == "fifo":
        os.mkfifo(marker)
    else:
        marker.write_text(DEEP[damage])
    with within(120):
        run = _run(tmp_path, resume="auto", max_epochs=2, console=True)
    assert run.state.progress.global_step == 4  # iter_4, the newest intact one
    out = capsys.readouterr().out
    assert "skipped checkpoint" in out and "COMPLETE" in out, out


# -- the best model's record -----------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["fifo", "deep"])
def test_a_best_models_fifo_or_deep_record_checks_nothing_and_the_weights_load(tmp_path, damage):
    """check_best reads the .json beside model_best.pth without waiting on a FIFO or raising RecursionError."""
    weights = {"w": torch.arange(3.0)}
    path = write_best(tmp_path, weights, metric="acc", value=0.5, step=2, digests=True)
    record = path.with_suffix(".json")
    assert "sha256" in json.loads(record.read_text())
    record.unlink()
    if damage == "fifo":
        os.mkfifo(record)
    else:
        record.write_text(DEEP["list"])
    with within(20):
        loaded = load_weights_file(path)
    assert torch.equal(loaded["w"], weights["w"])
