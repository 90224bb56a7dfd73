"""DCP metadata whose fields have the wrong type or shape is a CheckpointError naming trainer/.metadata, everywhere.

The metadata unpickler admits DCP's own classes only, but a crafted pickle
fills their fields with anything. A genuine run's ``trainer/.metadata`` is
altered one field at a time (its ``COMPLETE`` size set to match, as an
attacker would), then read by every path that reads it: ``safe_reading``,
``load_checkpoint``, a resume from the path, ``python -m pimm_fn verify`` and
``inspect``, and ``resume="auto"``, which must skip it for the older intact
checkpoint rather than abort on a raw ``TypeError``.
"""

import json
import pathlib
import pickle
import shutil
import sys
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata

import pimm_fn as pf
from pimm_fn.checkpoint import find_checkpoint, load_checkpoint
from pimm_fn.checkpoint.formats import dcp_reading as safe_reading
from pimm_fn.cli import main as cli

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402

METADATA = "trainer/.metadata"


hooks = tw.snapshotting


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A finished 10-step run: last/ (step 10), iter_4, iter_8, iter_10, and its final weights."""
    root = tmp_path_factory.mktemp("saved")
    return root / "run", tw.finished(root / "run")


def craft(checkpoint: pathlib.Path, change) -> None:
    """Apply ``change`` to the checkpoint's unpickled ``trainer/.metadata``, write it as a new file (a snapshot's
    hard link keeps the genuine bytes) and record its new size in ``COMPLETE``."""
    path = checkpoint / METADATA
    with open(path, "rb") as f:
        meta = pickle.load(f)  # our own genuine file
    change(meta)
    data = pickle.dumps(meta)
    path.unlink()
    path.write_bytes(data)
    marker = json.loads((checkpoint / "COMPLETE").read_text())
    marker["files"][METADATA]["size"] = len(data)
    (checkpoint / "COMPLETE").unlink()
    (checkpoint / "COMPLETE").write_text(json.dumps(marker))


def _tensors(meta):
    return {k: v for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def _each_tensor(change):
    def apply(meta):
        for entry in _tensors(meta).values():
            change(entry)

    return apply


def _each_storage(change):
    def apply(meta):
        for info in meta.storage_data.values():
            change(info)

    return apply


def _first_entry(value):
    def apply(meta):
        meta.state_dict_metadata[next(iter(meta.state_dict_metadata))] = value

    return apply


def _setter(obj, name, value):
    setattr(obj, name, value)


CASES = {  # name -> (change, what the error says)
    "state_dict_metadata a list": (
        lambda m: _setter(m, "state_dict_metadata", [1, 2]),
        r"has state_dict_metadata \[1, 2\] where DCP writes dict",
    ),
    "storage_data a list": (lambda m: _setter(m, "storage_data", [1]), r"has storage_data \[1\] where DCP writes dict"),
    "planner_data a list": (lambda m: _setter(m, "planner_data", ["x"]), r"has planner_data \['x'\]"),
    "storage_meta an int": (
        lambda m: _setter(m, "storage_meta", 3),
        r"has storage_meta 3 where DCP writes StorageMeta",
    ),
    "an entry an int": (_first_entry(5), r"lists '[^']+' as an object of type int, which DCP never writes"),
    "an entry keyed by an int": (
        lambda m: m.state_dict_metadata.update({7: m.state_dict_metadata.popitem()[1]}),
        r"lists an entry named 7 where DCP writes a string",
    ),
    "offset a string": (
        _each_storage(lambda i: _setter(i, "offset", "x")),
        r"has the offset of the storage of '[^']+' 'x' where DCP writes int",
    ),
    "length negative": (_each_storage(lambda i: _setter(i, "length", -1)), r"the length of the storage of .* -1"),
    "relative_path None": (
        _each_storage(lambda i: _setter(i, "relative_path", None)),
        r"lacks the relative_path of the storage of '[^']+'",
    ),
    "properties None": (
        _each_tensor(lambda e: _setter(e, "properties", None)),
        r"has the properties of tensor '[^']+' None where DCP writes TensorProperties",
    ),
    "dtype a string": (
        _each_tensor(lambda e: _setter(e.properties, "dtype", "float32")),
        r"has the dtype of tensor '[^']+' 'float32' where DCP writes dtype",
    ),
    "size a string": (
        _each_tensor(lambda e: _setter(e, "size", "abc")),
        r"has the size of tensor '[^']+' 'abc' where DCP writes Size or tuple",
    ),
    "size with a bool": (
        _each_tensor(lambda e: _setter(e, "size", (True,) * len(e.size))),
        r"has the size of tensor .* where DCP writes integers in \[0, 2\*\*63\)",
    ),
    "size beyond what is stored": (
        _each_tensor(
            lambda e: (
                _setter(e, "size", torch.Size([10**12])),
                _setter(e, "chunks", [ChunkStorageMetadata(torch.Size([0]), torch.Size([10**12]))]),
            )
        ),
        r"\(1,000,000,000,000 bytes\) stored in [\d,]+ bytes",
    ),
    "chunks None": (
        _each_tensor(lambda e: _setter(e, "chunks", None)),
        r"has the chunks of tensor '[^']+' None where DCP writes list",
    ),
    "a chunk outside the tensor": (
        _each_tensor(lambda e: _setter(e.chunks[0], "offsets", torch.Size([5] * len(e.size)))),
        r"outside its size",
    ),
    "a chunk of another rank": (
        _each_tensor(lambda e: _setter(e.chunks[0], "sizes", torch.Size([1, 1, 1, 1, 1]))),
        r"not of the tensor's rank",
    ),
    "chunks missing": (_each_tensor(lambda e: _setter(e, "chunks", [])), r"holding 0 elements where its size"),
}


def copied(saved, tmp_path) -> pathlib.Path:
    run_dir = tmp_path / "run"
    shutil.copytree(saved[0], run_dir)
    return run_dir


@pytest.mark.parametrize("name", sorted(CASES))
def test_metadata_with_a_field_of_the_wrong_type_is_a_checkpoint_error_naming_it(saved, tmp_path, name):
    """Each crafted field: safe_reading, load_checkpoint and a resume from the path raise CheckpointError naming
    trainer/.metadata and the field; verify and inspect say it is damaged (today: TypeError, AttributeError)."""
    change, says = CASES[name]
    last = copied(saved, tmp_path) / "model" / "last"
    craft(last, change)
    with pytest.raises(pf.CheckpointError, match=says) as raised:
        safe_reading.metadata(last)
    assert raised.value.file == METADATA and raised.value.path == str(last)
    with pytest.raises(pf.CheckpointError, match=says):
        load_checkpoint(find_checkpoint(last))
    with pytest.raises(pf.CheckpointError, match=says):
        tw.build(tmp_path / "again", hooks=hooks(), max_epochs=3, resume=str(last))
    assert cli(["verify", str(last)]) != 0
    assert cli(["inspect", str(last)]) != 0


@pytest.mark.parametrize("name", ["properties None", "size a string", "storage_data a list", "offset a string"])
def test_auto_resume_skips_crafted_metadata_for_the_older_intact_checkpoint(saved, tmp_path, capsys, name):
    """The two step-10 checkpoints (last, iter_10) with crafted metadata: resume='auto' says it skips each, naming
    trainer/.metadata, and resumes iter_8 exactly (today it aborted on the first one's raw exception)."""
    run_dir = copied(saved, tmp_path)
    for checkpoint in ("last", "iter_10"):
        craft(run_dir / "model" / checkpoint, CASES[name][0])
    model, run = tw.build(
        run_dir, hooks=hooks(), max_epochs=3, resume="auto", console=True, watching=pf.Watching(progress=False)
    )
    skipped = [line for line in capsys.readouterr().out.splitlines() if "skipped checkpoint" in line]
    assert run.state.progress.global_step == 8
    assert len(skipped) == 2 and all(METADATA in line for line in skipped), skipped
    run()
    trained = tw.weights(model)
    reference, again = tw.build(
        tmp_path / "ref",
        hooks=hooks(),
        max_epochs=3,  # one run at a time: one global RNG
        resume=str(saved[0] / "model" / "iter_8"),
    )
    again()
    assert tw.same_weights(trained, tw.weights(reference))


# -- any field, any value ------------------------------------------------------------------------------
# Values of every type a pickle can put in a field (a valid dtype is left out: DCP does not record the dtype a data
# file stores, so a swapped one converts silently, as it would in DCP itself; digests=True catches such an edit).
OTHERS = (
    None,
    0,
    -1,
    3,
    2**70,
    2.5,
    "x",
    True,
    (),
    (1,),
    [],
    [1, 2],
    {},
    {"a": 1},
    torch.Size([10**6]),
    torch.strided,
    ChunkStorageMetadata(torch.Size([0]), torch.Size([1])),
)


def _slots(meta) -> list[tuple]:
    """Every field of the genuine metadata, as (object path, attribute): what a crafted pickle can fill."""
    found = [
        (("meta",), name) for name in ("state_dict_metadata", "storage_data", "planner_data", "storage_meta", "version")
    ]
    for key, entry in _tensors(meta).items():
        found += [(("entry", key), name) for name in ("properties", "size", "chunks")]
        # memory_format is pickled as an enum member, which unpickling checks: it cannot hold another value
        found += [(("properties", key), name) for name in ("dtype", "layout", "requires_grad", "pin_memory")]
        found += [(("chunk", key), name) for name in ("offsets", "sizes")]
    for i in range(len(meta.storage_data)):
        found += [(("storage", i), name) for name in ("relative_path", "offset", "length", "transform_descriptors")]
    return found


def _owner(meta, where: tuple):
    kind = where[0]
    if kind == "meta":
        return meta
    if kind == "storage":
        return list(meta.storage_data.values())[where[1]]
    entry = meta.state_dict_metadata[where[1]]
    return {"entry": entry, "properties": entry.properties, "chunk": entry.chunks[0]}[kind]


@pytest.fixture(scope="module")
def genuine_meta(saved):
    with open(saved[0] / "model" / "last" / METADATA, "rb") as f:
        return pickle.load(f)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_field_set_to_any_value_reads_as_before_or_is_a_checkpoint_error(saved, genuine_meta, tmp_path, data):
    """A field of trainer/.metadata set to a value of any type: load_checkpoint reads what the genuine checkpoint
    holds or raises CheckpointError, never another exception. Shrinks towards the first field and a simple value."""
    where, name = data.draw(st.sampled_from(_slots(genuine_meta)), label="field")
    value = data.draw(st.sampled_from(OTHERS), label="value")
    last = pathlib.Path(tempfile.mkdtemp(dir=tmp_path)) / "last"
    shutil.copytree(saved[0] / "model" / "last", last)
    craft(last, lambda meta: setattr(_owner(meta, where), name, value))
    try:
        loaded = load_checkpoint(find_checkpoint(last))
    except pf.CheckpointError as exc:
        assert exc.file.startswith("trainer/"), exc  # the metadata, or the data file it sends the read to
        return
    genuine = load_checkpoint(find_checkpoint(saved[0] / "model" / "last"))
    assert tw.same(loaded.trainer, genuine.trainer) and tw.same(loaded.local, genuine.local)
