"""The one guarded DCP reading layer: no checkpoint-supplied route to code, on any supported CPython.

Checkpoints here are genuine ones (written by a real run), republished by
pimm_fn's own writer with one thing altered (``_crafted``); a payload that
would run creates a marker file, which must never appear.
"""

import ast
import enum
import io
import os
import pathlib
import pickle
import sys
import types

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

import pimm_fn as pf
from pimm_fn.checkpoint.formats import dcp_reading as safe_reading
from pimm_fn.checkpoint.formats.dcp_reading import MetadataUnpickler
from pimm_fn.checkpoint.formats.pack import skeleton_to_tensor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402
from _crafted import Payload, parts, republish  # noqa: E402

PACKAGE = pathlib.Path(pf.__file__).resolve().parent


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """A finished one-epoch run's last checkpoint (plain model, Adam, StepLR)."""
    save_dir = tmp_path_factory.mktemp("genuine")
    tw.build(save_dir, max_epochs=1)[1]()
    return save_dir / "model" / "last"


def _resume(path, save_dir):
    """Resume ``path`` into a plain model with ``pf.loop(resume=path)``, and run it."""
    model, run = tw.build(save_dir, resume=str(path), max_epochs=2)
    run()
    return model


def test_a_crafted_sharded_claim_with_a_pickled_shard_is_refused_and_never_run(genuine, tmp_path):
    """A checkpoint whose trainer part says 'sharded' and whose model shard is a pickled object: resuming it into a
    plain model raises CheckpointError before any DCP read, and the payload never runs (today it ran on resume)."""
    marker = tmp_path / "ran"
    trainer, _, weights, _ = parts(genuine)
    crafted = republish(
        genuine,
        tmp_path / "crafted" / "model",
        trainer={"sharded": True, "optimizer": {"state": {}, "param_groups": None}},
        entries={f"sharded/model/{name}": Payload(marker) for name in weights},
    )
    with pytest.raises(pf.CheckpointError, match=r"sharded/model/.*pickled object"):
        _resume(crafted, tmp_path / "run")
    assert not marker.exists()


def test_a_trainer_skeleton_nested_too_deeply_is_a_damaged_checkpoint(genuine, tmp_path):
    """A skeleton of 100,000 brackets is refused as damaged before the parser recurses (it met the recursion limit)."""
    deep = skeleton_to_tensor("[" * 100000)
    crafted = republish(genuine, tmp_path / "crafted" / "model", entries={"trainer/skeleton": deep})
    with pytest.raises(pf.CheckpointError, match=r"does not unpack \(ValueError: .*nested too deeply to parse\)"):
        _resume(crafted, tmp_path / "run")


def test_a_sharded_claim_without_shards_is_refused_before_anything_loads(genuine, tmp_path):
    """The trainer part's 'sharded' flag must be backed by sharded/model/ tensors: a flipped one is a CheckpointError."""
    crafted = republish(genuine, tmp_path / "crafted" / "model", trainer={"sharded": True})
    with pytest.raises(pf.CheckpointError, match=r"says its model was sharded.*lists no 'sharded/model/"):
        _resume(crafted, tmp_path / "run")


def test_a_pickled_entry_where_pimm_fn_packs_a_tensor_is_refused_everywhere(genuine, tmp_path):
    """A trainer entry swapped for a pickled object: resume, inspection (contents_of) and verify refuse it unread."""
    marker = tmp_path / "ran"
    crafted = republish(genuine, tmp_path / "crafted" / "model", entries={"trainer/t/0": Payload(marker)})
    with pytest.raises(pf.CheckpointError, match=r"'trainer/t/0' as a non-tensor entry"):
        _resume(crafted, tmp_path / "run")
    from pimm_fn.checkpoint.inspection import contents_of

    with pytest.raises((pf.CheckpointError, ValueError)):
        contents_of(crafted)
    from pimm_fn.cli import main

    assert main(["verify", str(crafted)]) != 0
    assert not marker.exists()


def test_a_pickled_entry_where_a_skeleton_places_a_numpy_value_is_refused_by_inspection(genuine, tmp_path):
    """A trainer skeleton's numpy value, whose entry is swapped for a pickled object: contents_of (``show``, ``ls``)
    raises a ValueError naming the entry (an AttributeError escaped it before), and the payload never runs."""
    import numpy as np

    from pimm_fn.checkpoint.formats.pack import pack
    from pimm_fn.checkpoint.inspection import contents_of, numpy_keys

    marker = tmp_path / "ran"
    extra = {"extra": {"ema": {"mean": np.zeros(3)}}}
    (key,) = numpy_keys(pack({**parts(genuine)[0], **extra})[0])  # the number its writer gives the array
    crafted = republish(
        genuine, tmp_path / "crafted" / "model", trainer=extra, entries={f"trainer/t/{key}": Payload(marker)}
    )
    with pytest.raises(ValueError, match=rf"has no 'trainer/t/{key}' tensor: not written by pimm_fn"):
        contents_of(crafted)
    assert not marker.exists()


def test_the_layer_refuses_a_pickled_entry_even_asked_for_directly(genuine, tmp_path):
    """load() with a tensor where the checkpoint lists a pickled object raises CheckpointError naming the entry;
    the reader refuses DCP's own planner, so a dcp.load that forgets ours cannot unpickle either."""
    marker = tmp_path / "ran"
    crafted = republish(genuine, tmp_path / "crafted" / "model", entries={"extra/thing": Payload(marker)})
    with pytest.raises(pf.CheckpointError, match=r"'extra/thing' as a pickled object where a tensor is expected"):
        safe_reading.load({"extra/thing": torch.empty(1)}, crafted)
    reader = safe_reading._Reader(crafted / "trainer", safe_reading.metadata(crafted))
    with pytest.raises(BaseException, match=r"dcp_reading's planner only"):
        dcp.load({"extra/thing": torch.empty(1)}, storage_reader=reader, no_dist=True)
    assert not marker.exists()


def test_an_entry_of_another_shape_or_dtype_is_a_checkpoint_error(genuine):
    """Where a tensor is expected, one of another shape or dtype is refused before a byte is read, naming both."""
    meta = safe_reading.metadata(genuine).state_dict_metadata
    entry = meta["trainer/skeleton"]
    with pytest.raises(
        pf.CheckpointError,
        match=r"holds 'trainer/skeleton' as a uint8\[\d+\] tensor where this run "
        r"expects uint8\[1\]",
    ):
        safe_reading.load({"trainer/skeleton": torch.empty(1, dtype=torch.uint8)}, genuine)
    with pytest.raises(pf.CheckpointError, match=r"expects float32"):
        safe_reading.load({"trainer/skeleton": torch.empty(entry.size, dtype=torch.float32)}, genuine)


def test_data_files_named_outside_the_directory_are_refused(genuine, tmp_path):
    """Metadata naming a data file by a path (``../x``) is a damaged checkpoint, never read."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(genuine, copy)
    meta = safe_reading.metadata(copy)
    for info in meta.storage_data.values():
        info.relative_path = "../../outside.distcp"
    with open(copy / "trainer" / ".metadata", "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(pf.CheckpointError, match=r"names the data file '../../outside.distcp', outside its directory"):
        safe_reading.metadata(copy)


# -- the metadata unpickler, across CPython releases ----------------------------------------------------
class _Pickler311(pickle.Pickler):
    """Pickles enum members as Debian 12's CPython 3.11.2 does: ``getattr(EnumClass, "NAME")``."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def _as_311(obj) -> bytes:
    buffer = io.BytesIO()
    _Pickler311(buffer).dump(obj)
    return buffer.getvalue()


def test_enum_members_pickled_through_getattr_read_back(genuine, tmp_path, monkeypatch):
    """DCP metadata whose enum members reduce to getattr(EnumClass, NAME), as CPython 3.11.2 pickles them: it reads
    back through the layer, and a checkpoint written so (DCP's own pickle.dump doing it) verifies and resumes
    exactly as the genuine one."""
    data = _as_311(safe_reading.metadata(genuine))
    assert b"getattr" in data and b"_MEM_FORMAT_ENCODING" in data
    read = MetadataUnpickler(io.BytesIO(data)).load()
    assert read.state_dict_metadata.keys() == safe_reading.metadata(genuine).state_dict_metadata.keys()
    from torch.distributed.checkpoint import filesystem

    as_311 = types.SimpleNamespace(**vars(pickle))
    as_311.dump = lambda obj, file, *args, **kwargs: _Pickler311(file).dump(obj)  # the interpreter's pickling, emulated
    monkeypatch.setattr(filesystem, "pickle", as_311)
    written_by_311 = republish(genuine, tmp_path / "model")
    monkeypatch.undo()
    assert b"getattr" in (written_by_311 / "trainer" / ".metadata").read_bytes()
    from pimm_fn.cli import main

    assert main(["verify", str(written_by_311)]) == 0
    resumed = _resume(written_by_311, tmp_path / "a")
    reference = _resume(genuine, tmp_path / "b")
    assert tw.same_weights(tw.weights(resumed), tw.weights(reference))


def _text(s: str) -> bytes:
    return b"\x8c" + bytes([len(s.encode())]) + s.encode()  # SHORT_BINUNICODE


def _getattr_pickle(module: str, target: str, name: str) -> bytes:
    """A protocol-4 pickle of ``getattr(<module>.<target>, name)``, written opcode by opcode."""
    found = _text("builtins") + _text("getattr") + b"\x93" + _text(module) + _text(target) + b"\x93"  # STACK_GLOBALs
    return b"\x80\x04" + found + _text(name) + b"\x86R."  # TUPLE2, REDUCE, STOP


@pytest.mark.parametrize(
    "module, target, name",
    [
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", "__init__"),  # not a member name
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", "_missing_"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties", "create_from_tensor"),  # a DCP class, no enum
        ("torch", "Size", "__class__"),  # admitted, but no enum at all
        ("torch.distributed.checkpoint.metadata", "torch", "load"),  # a module attribute of a DCP module
    ],
)
def test_getattr_is_never_applied_to_anything_but_a_dcp_enum_member(module, target, name):
    """builtins.getattr in metadata is honoured only as getattr(<DCP enum>, <member name>); anything else refused."""
    assert (
        MetadataUnpickler(io.BytesIO(_getattr_pickle(module, "_MEM_FORMAT_ENCODING", "TORCH_CHANNELS_LAST"))).load()
        is _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST
        if module.endswith("metadata")
        else True
    )
    with pytest.raises(pickle.UnpicklingError):
        MetadataUnpickler(io.BytesIO(_getattr_pickle(module, target, name))).load()


def test_a_getattr_os_system_payload_never_runs(tmp_path):
    """The classic payload, getattr(__import__("os"), "system")("touch <marker>"), as a whole .metadata: refused,
    nothing run; a member of a DCP enum pickled the 3.11.2 way still reads."""
    marker = tmp_path / "ran"

    class Smuggled:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    class Via(pickle.Pickler):
        def reducer_override(self, obj):
            if obj is os.system:
                return getattr, (os, "system")
            if obj is os:
                return __import__, ("os",)
            return NotImplemented

    for protocol in (2, 4):
        buffer = io.BytesIO()
        Via(buffer, protocol=protocol).dump(Smuggled())
        assert b"getattr" in buffer.getvalue()
        with pytest.raises(pickle.UnpicklingError):
            MetadataUnpickler(io.BytesIO(buffer.getvalue())).load()
    assert not marker.exists()
    assert (
        MetadataUnpickler(io.BytesIO(_as_311(_MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST))).load()
        is _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST
    )


# -- one layer, no bypass -------------------------------------------------------------------------------
_FORBIDDEN = {"FileSystemReader", "FsspecReader", "DefaultLoadPlanner", "load_state_dict_from_keys", "_load_state_dict"}


def _dcp_reads(tree: ast.AST, dcp_names: set) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _FORBIDDEN:
            found.append(node.attr)
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("load", "load_state_dict")
            and ast.unparse(node.value) in {"torch.distributed.checkpoint", *dcp_names}
        ):
            found.append(f"{ast.unparse(node.value)}.{node.attr}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed.checkpoint"):
            found += [a.name for a in node.names if a.name in _FORBIDDEN | {"load", "load_state_dict"}]
        if isinstance(node, ast.Name) and node.id in _FORBIDDEN:
            found.append(node.id)
    return found


def _dcp_aliases(tree: ast.AST) -> set:
    """The names ``torch.distributed.checkpoint`` is imported as (``import ... as dcp``, ``from torch.distributed ...``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.asname or a.name for a in node.names if a.name == "torch.distributed.checkpoint"}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            found |= {a.asname or a.name for a in node.names if a.name == "checkpoint"}
    return found


def test_no_module_outside_the_layer_reads_dcp_itself():
    """Every DCP read goes through pimm_fn.checkpoint.formats.dcp_reading: no other module calls dcp.load, builds a
    FileSystemReader or a load planner (an AST scan of the package)."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "dcp_reading.py":
            continue
        tree = ast.parse(path.read_text())
        found = _dcp_reads(tree, _dcp_aliases(tree))
        if found:
            offenders[str(path.relative_to(PACKAGE))] = found
    assert offenders == {}


def test_the_scan_would_see_a_bypass():
    """The scan flags the shapes a bypass would take (so the test above can fail)."""
    source = (
        "import torch.distributed.checkpoint as dcp\n"
        "from torch.distributed.checkpoint import FileSystemReader\n"
        "dcp.load(s, storage_reader=FileSystemReader(p))\n"
    )
    tree = ast.parse(source)
    assert sorted(_dcp_reads(tree, _dcp_aliases(tree))) == ["FileSystemReader", "FileSystemReader", "dcp.load"]
    assert _dcp_reads(ast.parse("import torch\ntorch.distributed.checkpoint.load(s)\n"), set()) == [
        "torch.distributed.checkpoint.load"
    ]
