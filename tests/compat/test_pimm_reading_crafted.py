"""A pimm DCP checkpoint whose metadata places its entries where no payload can hold them is refused, with the reason.

pimm's ``trainer.dcp/`` is written by ``dcp.save`` of a nested payload; its
``.metadata`` records, in ``planner_data``, the path of each flat entry in
that payload. A crafted ``.metadata`` (passing the metadata unpickler) sets
those paths to an int, an empty tuple, a list inside a tuple, or two entries
on one path: ``read_pimm_checkpoint`` raises ``PimmCheckpointError`` naming
the ``.metadata`` and the entry, where it raised ``TypeError`` or
``IndexError`` (or silently dropped an entry) before; ``planner_data`` of
another type than DCP's dict is a ``CheckpointError`` of the metadata checks.
"""

import pathlib
import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

import pimm_fn as pf
from pimm_fn.compat.reading import PimmCheckpointError, read_pimm_checkpoint


def split_checkpoint(directory: pathlib.Path) -> pathlib.Path:
    """pimm's split layout, written as pimm writes it: weights.pth, trainer.dcp/ by dcp.save, .complete markers."""
    (directory / "trainer.dcp").mkdir(parents=True)
    torch.save({"state_dict": {"w": torch.ones(2)}}, directory / "weights.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: DCP says it saves in a single process
        dcp.save(
            {"trainer": {"epoch": 1, "global_step": 4}, "t": torch.arange(3.0)},
            checkpoint_id=directory / "trainer.dcp",
            no_dist=True,
        )
    for marker in (directory, directory / "trainer.dcp"):
        (marker / ".complete").write_text("ok\n")
    return directory


def craft(directory: pathlib.Path, planner_data) -> None:
    """Set ``trainer.dcp/.metadata``'s planner_data to ``planner_data(metadata)``."""
    path = directory / "trainer.dcp" / ".metadata"
    with open(path, "rb") as f:
        meta = pickle.load(f)  # the genuine file this test wrote
    meta.planner_data = planner_data(meta)
    path.write_bytes(pickle.dumps(meta))


def _keys(meta) -> list:
    return sorted(meta.state_dict_metadata)


PLACEMENTS = {  # name -> (planner_data from the metadata, what the error says)
    "a path that is an int": (
        lambda m: {k: 5 for k in _keys(m)},
        r"places '[^']+' at 5, where DCP writes a "
        r"non-empty tuple of names and indices",
    ),
    "an empty path": (lambda m: {k: () for k in _keys(m)}, r"places '[^']+' at \(\), where DCP writes"),
    "a list inside a path": (lambda m: {k: ([1], "x") for k in _keys(m)}, r"places '[^']+' at \(\[1\], 'x'\)"),
    "a bool inside a path": (lambda m: {k: (True,) for k in _keys(m)}, r"places '[^']+' at \(True,\)"),
    "one path inside another": (
        lambda m: {k: ("a",) if i == 0 else ("a", f"b{i}") for i, k in enumerate(_keys(m))},
        r"places '[^']+' at \('a', 'b\d'\) and '[^']+' at \('a',\): one would overwrite",
    ),
    "two entries on one path": (lambda m: {k: ("same",) for k in _keys(m)}, r"at \('same',\): one would overwrite"),
}


def test_the_genuine_split_checkpoint_reads_back_its_payload(tmp_path):
    """The layout these tests alter, unaltered: its weights and nested payload read back as written."""
    read = read_pimm_checkpoint(split_checkpoint(tmp_path / "last"))
    assert list(read.weights) == ["w"] and read.payload["trainer"] == {"epoch": 1, "global_step": 4}
    assert torch.equal(read.payload["t"], torch.arange(3.0))


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_planner_data_placing_entries_where_no_payload_holds_them_is_a_pimm_checkpoint_error(tmp_path, name):
    """Each crafted placement: read_pimm_checkpoint raises PimmCheckpointError naming trainer.dcp/.metadata and the
    entry (before: TypeError, IndexError, or an entry silently overwritten)."""
    directory = split_checkpoint(tmp_path / "last")
    planner_data, says = PLACEMENTS[name]
    craft(directory, planner_data)
    with pytest.raises(PimmCheckpointError, match=says) as raised:
        read_pimm_checkpoint(directory)
    assert str(directory / "trainer.dcp" / ".metadata") in str(raised.value)


@pytest.mark.parametrize("planner_data", [[("trainer", "epoch")], "x", 3])
def test_planner_data_of_another_type_is_a_checkpoint_error_of_the_metadata(tmp_path, planner_data):
    """planner_data that is not DCP's dict (or None): the metadata checks refuse it as a CheckpointError naming
    .metadata, before any entry is read."""
    directory = split_checkpoint(tmp_path / "last")
    craft(directory, lambda meta: planner_data)
    with pytest.raises(pf.CheckpointError, match=r"\.metadata has planner_data .* where DCP writes dict or None"):
        read_pimm_checkpoint(directory)
