"""The public inspection API: what a model_dir and its checkpoints hold, named, described and read back."""

import pathlib

import pytest
import torch

from pimm_fn.checkpoint import CheckpointError, save_checkpoint, write_best
from pimm_fn.checkpoint import inspection

WEIGHTS = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}


@pytest.fixture
def model_dir(tmp_path) -> pathlib.Path:
    """A model_dir with a standard last/, a legacy iter_4.pth snapshot, a best file and an interrupted save."""
    save_checkpoint(tmp_path, step=4, weights=WEIGHTS, trainer={"lr": 0.1}, local={}, format="legacy", snapshot=True)
    save_checkpoint(tmp_path, step=8, weights=WEIGHTS, trainer={"lr": 0.1}, local={"r": 1})
    write_best(tmp_path, WEIGHTS, metric="acc", value=0.5, step=8)
    (tmp_path / ".staging-last-12").mkdir()
    return tmp_path


def test_each_entry_is_named_by_what_it_is(model_dir):
    """kind_of names checkpoints, best files and unfinished saves by their names alone, with the step they say."""
    kinds = {p.name: inspection.kind_of(p) for p in model_dir.iterdir()}
    assert kinds["last"] == ("checkpoint", None)
    assert kinds["iter_4.pth"] == ("checkpoint", 4)
    assert kinds["model_best.pth"] == ("best", None)
    assert kinds[".staging-last-12"] == ("unfinished", 12)
    assert inspection.kind_of(model_dir / "notes.txt") is None
    assert inspection.is_checkpoint_dir(model_dir / "last") and not inspection.is_checkpoint_dir(model_dir)
    assert not inspection.is_marked(model_dir / ".staging-last-12") and inspection.is_marked(model_dir / "last")


def test_a_checkpoint_is_described_without_reading_its_tensors(model_dir):
    """The marker, the trainer part and the weights are told with shapes in place of tensors."""
    assert inspection.marker(model_dir / "last")["step"] == 8
    assert inspection.marker(model_dir / "iter_4.pth")["step"] == 4
    assert inspection.trainer_without_tensors(model_dir / "last") == {"lr": 0.1}
    weights = inspection.weights_without_tensors(model_dir / "last")
    assert weights == {
        "w": inspection.TensorInfo("float32", (2, 3), 24),
        "b": inspection.TensorInfo("float32", (3,), 12),
    }
    assert inspection.size_of(model_dir / "last") > 36


def test_read_back_reads_every_byte_and_names_a_damaged_file(model_dir):
    """A sound checkpoint reads back with notes; a data file cut short is a CheckpointError naming it."""
    for path, best in (
        (model_dir / "last", False),
        (model_dir / "iter_4.pth", False),
        (model_dir / "model_best.pth", True),
    ):
        problems, notes = inspection.read_back(path, best=best)
        assert problems == [] and notes, path
    data = next((model_dir / "last" / "trainer").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=data.name):
        inspection.read_back(model_dir / "last")


def test_plain_weights_are_written_atomically_as_contiguous_cpu_tensors(tmp_path):
    """write_plain_weights writes what torch.load(weights_only=True) reads back equal, views made contiguous."""
    out = tmp_path / "plain.pth"
    plain = inspection.write_plain_weights(out, {"t": torch.arange(6.0).reshape(2, 3).t(), "n": 3})
    loaded = torch.load(out, weights_only=True)
    assert plain["t"].is_contiguous() and torch.equal(loaded["t"], torch.arange(6.0).reshape(2, 3).t())
    assert loaded["n"] == 3 and [p.name for p in tmp_path.iterdir()] == ["plain.pth"]
