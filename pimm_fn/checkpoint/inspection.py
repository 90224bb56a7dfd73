"""What a model_dir holds and what each checkpoint in it holds, read without its tensors, for tools: list, describe, read back, export.

The public reading API of the checkpoint layer for everything that is not
a training run (the ``python -m pimm_fn`` commands, notebooks): callers
never need the layout's file names or the formats' private modules.

- **how a run stands**: :func:`newest` is the checkpoint ``resume="auto"``
  takes, with the newer ones it passes over and why.
- **list**: :func:`kind_of` names an entry of a model_dir by what it is
  (``checkpoint``, ``best``, ``retired``, ``unfinished``; on an fsspec store
  a ``last-<step>-<token>`` or ``iter_<step>`` directory without its marker is
  ``unfinished``);
  :func:`is_marked` says whether a checkpoint directory was ever finished;
  :func:`marker` reads a finished one's completion marker, validated.
- **describe** without reading tensors: :func:`trainer_without_tensors`,
  :func:`contents_of`, :func:`weights_without_tensors` (tensors as
  :class:`TensorInfo`), :func:`size_of`.
- **read back**: :func:`read_back` reads every byte of a checkpoint (or
  best-model file) as a resume would and says what it checked.
- **export**: :func:`write_plain_weights` writes weights as a file anyone
  can ``torch.load(weights_only=True)``, or as safetensors (no pickle) with
  what :func:`provenance` says of them in the header, atomically.

Nothing here runs code from a checkpoint: every read goes through
``torch.load(weights_only=True)`` or :mod:`pimm_fn.checkpoint.formats.dcp_reading`.

What a checkpoint holds, read without its tensors: for listing and inspecting from the shell.

The trainer part is a packed tree (``_pack``): a JSON skeleton that names
its tensors. Reading the skeleton alone, with a :class:`TensorInfo` (shape,
dtype, bytes: from DCP's metadata, or from a legacy file mapped, not read)
in place of each tensor, gives the whole tree — progress, metrics, hook
slots, optimizer hyper-parameters — at the cost of a few kilobytes, whatever
the model's size. ``contents_of`` turns it into the ``TrainerContents`` the
loader would build (``local`` left out).
"""

from __future__ import annotations

import io
import json
import pathlib
import re
from typing import Any

import attrs
import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from pimm_fn.checkpoint import discovery, files, storage
from pimm_fn.checkpoint.contents import TrainerContents, from_parts
from pimm_fn.checkpoint.discovery import find_checkpoint
from pimm_fn.checkpoint.errors import CheckpointError
from pimm_fn.checkpoint.files import CheckpointInfo
from pimm_fn.checkpoint.formats import dcp_reading, one_file, safetensors_files
from pimm_fn.checkpoint.formats.one_file import best_record, check_best, record_problem
from pimm_fn.checkpoint.formats.pack import tensor_to_skeleton, unpack
from pimm_fn.checkpoint.retention import REMOVING
from pimm_fn.checkpoint.retention import marker_of as marker
from pimm_fn.checkpoint.validation import SET_ASIDE, confined, validate
from pimm_fn.core import untrusted_json

__all__ = [
    "TensorInfo",
    "trainer_without_tensors",
    "contents_of",
    "tensor_infos",
    "infos_of",
    "numpy_keys",
    "weights_without_tensors",
    "size_of",
    "TRAINER",
    "is_best_file",
    "is_checkpoint_dir",
    "is_marked",
    "is_removal",
    "kind_of",
    "marker",
    "newest",
    "provenance",
    "read_back",
    "write_plain_weights",
]


@attrs.frozen
class TensorInfo:
    """A tensor of a checkpoint, not read: its dtype, shape and size in bytes."""

    dtype: str
    shape: tuple
    nbytes: int

    def __repr__(self):
        return f"tensor({self.dtype}, {list(self.shape)})"


def _info(dtype: torch.dtype, shape) -> TensorInfo:
    numel = 1
    for n in shape:
        numel *= int(n)
    return TensorInfo(str(dtype).removeprefix("torch."), tuple(int(n) for n in shape), numel * dtype.itemsize)


def tensor_infos(path: storage.Location) -> dict[str, TensorInfo]:
    """Every tensor entry of a standard checkpoint's ``trainer/`` DCP directory, from its metadata alone."""
    return infos_of(dcp_reading.metadata(path).state_dict_metadata)


def infos_of(meta: dict) -> dict[str, TensorInfo]:
    """Each tensor entry of DCP metadata (``state_dict_metadata``) as a :class:`TensorInfo`."""
    return {k: _info(e.properties.dtype, e.size) for k, e in meta.items() if isinstance(e, TensorStorageMetadata)}


def numpy_keys(skeleton: str) -> set[str]:
    """The tensors a skeleton stores numpy values in: those must be read, as ``unpack`` needs their bytes."""
    return _ndarray_keys(untrusted_json.loads(skeleton))


def _ndarray_keys(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["ndarray"]} if "ndarray" in node else set()
        return found.union(*(_ndarray_keys(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_ndarray_keys(v) for v in node))
    return set()


def trainer_without_tensors(path: storage.Location) -> dict:
    """The replicated trainer part of a checkpoint (directory or legacy file), its tensors as :class:`TensorInfo`.

    Raises:
        ValueError / OSError: the trainer part is missing or unreadable.
    """
    if path.is_file():
        packed = one_file._load(path, mmap=True)["trainer"]  # mapped: no tensor byte is read
        skeleton, stored = packed["skeleton"], packed["tensors"]
        infos = {k: _info(t.dtype, t.shape) for k, t in stored.items()}
        needed = {k: stored[k] for k in numpy_keys(skeleton)}
        leaves: dict[str, Any] = {**infos, **needed}  # each tensor's TensorInfo in its place; numpy values read
        return unpack(skeleton, leaves)
    meta = dcp_reading.metadata(path).state_dict_metadata
    head = {"trainer/skeleton": _empty(meta, path, "trainer/skeleton")}
    _read(path, head)
    skeleton = tensor_to_skeleton(head["trainer/skeleton"])
    infos = {k.removeprefix("trainer/t/"): v for k, v in infos_of(meta).items() if k.startswith("trainer/t/")}
    needed = {f"trainer/t/{k}": _empty(meta, path, f"trainer/t/{k}") for k in numpy_keys(skeleton)}
    _read(path, needed)
    needed = {k.removeprefix("trainer/t/"): v for k, v in needed.items()}
    leaves = {**infos, **needed}
    return unpack(skeleton, leaves)


def _empty(meta: dict, path: storage.Location, key: str) -> torch.Tensor:
    """An uninitialized tensor for the entry ``key`` of ``path``'s DCP metadata ``meta``, to read it into.

    Raises:
        ValueError: the metadata lists no tensor under ``key`` (none, or a pickled object).
    """
    entry = meta.get(key)
    if not isinstance(entry, TensorStorageMetadata):
        raise ValueError(f"{path / files.TRAINER} has no {key!r} tensor: not written by pimm_fn")
    return dcp_reading.empty(entry, path, key)


def _read(path: storage.Location, state: dict) -> None:
    """Read the entries of ``state`` (and only those) from a standard checkpoint's DCP directory, in place."""
    if state:
        dcp_reading.load(state, path)


def contents_of(path: storage.Location) -> TrainerContents:
    """The checkpoint's ``TrainerContents`` (no local part), its tensors as :class:`TensorInfo`."""
    return from_parts(trainer_without_tensors(path), None)


def size_of(path: storage.Location) -> int:
    """Bytes on disk of a file, or of every file under a directory (hard-linked snapshots count in full)."""
    if path.is_file():
        return path.stat().st_size
    if storage.is_store(path):
        return sum(path.files().values())
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def weights_without_tensors(path: storage.Location) -> dict[str, TensorInfo]:
    """The model weights a checkpoint holds, as :class:`TensorInfo` by name (mapped, not read).

    A sharded model saved without ``model.pth`` gives its shards' full shapes.

    Raises:
        CheckpointError: the weights read are not a state_dict (``one_file.weights_problem``).
    """
    if path.is_dir() and (path / files.WEIGHTS_SKIPPED).is_file():
        prefix = "sharded/model/"
        return {k.removeprefix(prefix): v for k, v in tensor_infos(path).items() if k.startswith(prefix)}
    if path.is_dir():
        weights = one_file.checked_weights(one_file._load(path / files.WEIGHTS, mmap=True), path, files.WEIGHTS)
    else:
        content = one_file._load(path, mmap=True)
        weights = content.get("weights", content) if isinstance(content, dict) else {}
        if isinstance(content, dict) and "weights" in content:  # a legacy checkpoint's: a state_dict, or damaged
            weights = one_file.checked_weights(weights, path, path.name)
    return {k: _info(v.dtype, v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}


TRAINER = files.TRAINER


"""The directory of a standard checkpoint holding the trainer part (DCP): the file an error about that part names."""


_BATCH_BYTES = 256 * 2**20  # tensors read per DCP load: bounded memory for any checkpoint size


NOT_RECORDED = "sizes and checksums are not recorded in this checkpoint's marker: only readability was checked"


def is_checkpoint_dir(path: storage.Location) -> bool:
    """A directory laid out as a standard checkpoint (complete or not)."""
    return path.is_dir() and any((path / name).exists() for name in (files.MARKER, files.TRAINER, files.WEIGHTS))


def is_marked(path: storage.Location) -> bool:
    """Whether a checkpoint directory has its completion marker (was ever finished); a file always counts."""
    return not path.is_dir() or (path / files.MARKER).exists()


def is_best_file(path: storage.Location) -> bool:
    """A ``model_best.pth`` or ``model_best_<metric>.pth`` file."""
    return path.is_file() and files.is_best_name(path)


def is_removal(path: storage.Location) -> bool:
    """An ``unfinished`` entry that is a snapshot being removed by retention, not a save."""
    return path.name.startswith(REMOVING)


def kind_of(path: storage.Location) -> tuple[str, int | None] | None:
    """``(kind, step)`` of a model_dir entry by its name; ``None`` for a name nothing pimm_fn writes has.

    ``kind``: ``"checkpoint"`` (``last``, ``iter_<step>``, either format),
    ``"best"``, ``"retired"`` (the previous ``last`` during a publish),
    ``"unfinished"`` (``.staging-*``: a save in progress or interrupted, or a
    snapshot being removed) or ``"set aside"`` (``damaged-*``: one a save
    found damaged where it wrote, kept; :mod:`pimm_fn.checkpoint.validation`); ``step``: the
    step the name says, if any.
    """
    name = path.name
    if name.startswith(files.STAGING):
        return "unfinished", _trailing_step(name)
    if name.startswith(SET_ASIDE):
        match = re.match(rf"{SET_ASIDE}iter_(\d+)", name)
        return "set aside", int(match.group(1)) if match else None
    if name.startswith(files.RETIRED):
        return "retired", _trailing_step(name)
    if is_best_file(path):
        return "best", None
    if name in (files.LAST, files.LEGACY_LAST):
        return "checkpoint", None
    if storage.is_store(path):
        return _stored_kind(path)
    match = (files.ITER_DIR if path.is_dir() else files.ITER_FILE).match(name)
    return ("checkpoint", int(match.group(1))) if match else None


def _stored_kind(path: storage.StorePath) -> tuple[str, int | None] | None:
    """:func:`kind_of` on an fsspec store: ``last-<step>-<token>`` and ``iter_<step>``, unfinished until their marker exists."""
    match = files.STORE_LAST.match(path.name) or files.ITER_DIR.match(path.name)
    if match is None:
        return None
    return ("checkpoint" if (path / files.MARKER).exists() else "unfinished"), int(match.group(1))


def _trailing_step(name: str) -> int | None:
    """The step in ``.staging-last-<step>``, ``.staging-removed-iter_<step>``, ``.retired-last-<step>``."""
    match = re.search(r"(?:last-|iter_)(\d+)(?:\.pth)?$", name)
    return int(match.group(1)) if match else None


def newest(model_dir: storage.Location) -> tuple[CheckpointInfo | None, list[tuple]]:
    """The checkpoint ``resume="auto"`` takes in ``model_dir`` (``None``: none is usable), and the newer ones it passes
    over, each as ``(path, CheckpointError)``: local, no collectives (:mod:`pimm_fn.checkpoint.discovery`)."""
    passed: list[tuple[storage.Location, CheckpointError | None]] = []
    for found in discovery.candidates(model_dir):
        if found.info is not None:
            return found.info, passed
        passed.append((found.path, found.error))
    return None, passed


def read_back(path: storage.Location, *, best: bool = False) -> tuple[list[str], list[str]]:
    """Read every byte of a checkpoint (or, with ``best``, a best-model file) as a resume would.

    Returns:
        ``(problems, notes)``: what makes it damaged, and what was checked.

    Raises:
        CheckpointError / OSError / ValueError: it does not read back.
    """
    if best:
        return _best(path)
    return _standard(path) if path.is_dir() else _legacy_file(path)


def write_plain_weights(out: pathlib.Path, weights: dict, *, format: str = "pth", metadata: dict | None = None) -> dict:
    """Write ``weights`` to ``out`` atomically as plain tensors (contiguous CPU copies); returns what was written.

    ``format="pth"`` writes what ``torch.load(weights_only=True)`` reads;
    ``"safetensors"`` writes no pickle at all, ``metadata`` (str to str, e.g.
    :func:`provenance`'s) and the tensors' SHA-256 in its header
    (:mod:`pimm_fn.checkpoint.formats.safetensors_files`; the ``safetensors`` extra).

    Raises:
        ImportError: ``"safetensors"`` without the ``safetensors`` package (naming the extra).
        ValueError: ``"safetensors"`` and a value that is not a tensor, naming its key.
    """
    if format == "safetensors":
        safetensors_files.require()  # before any copy is made
    # Plain tensors only: no storage shared with a mapped file, a larger buffer or another tensor.
    plain = {
        k: v.detach().to("cpu").contiguous().clone() if isinstance(v, torch.Tensor) else v for k, v in weights.items()
    }
    if format == "safetensors":
        safetensors_files.write_safetensors(out, plain, metadata)
    else:
        files.atomic_write(out, lambda f: torch.save(plain, f))
    return plain


def provenance(path) -> dict[str, str]:
    """What the checkpoint or best-model file at ``path`` records of its weights, as safetensors metadata (str to str).

    A best-model file: ``pimm_fn.step``, ``pimm_fn.metric`` and
    ``pimm_fn.value`` (its ``.json``'s record); a checkpoint (or a
    save_dir/model_dir: its newest): ``pimm_fn.step`` and
    ``pimm_fn.metrics`` (JSON: the metrics its marker records). Either
    with ``pimm_fn.source_sha256``, the SHA-256 recorded for the weights
    file read, where digests were on. Anything else (a plain state_dict
    file, a Hub model): nothing.
    """
    p = storage.location(path)
    try:
        if is_best_file(p):
            record = best_record(p)
            found = {
                "step": record["step"],
                "metric": record["metric"],
                "value": repr(float(record["value"])),
                "source_sha256": record.get("sha256") if isinstance(record.get("sha256"), str) else None,
            }
        else:
            info = find_checkpoint(p)
            recorded = marker(info.path)
            recorded_files = recorded.get("files")
            entry = (
                recorded_files.get(files.WEIGHTS)
                if isinstance(recorded_files, dict) and info.format == "standard"
                else None
            )
            metrics = recorded.get("metrics")
            found = {
                "step": info.step,
                "metrics": json.dumps(metrics, sort_keys=True) if isinstance(metrics, dict) else None,
                "source_sha256": entry.get("sha256") if isinstance(entry, dict) else None,
            }
    except (OSError, ValueError):  # no record beside it, or no checkpoint: the weights alone
        return {}
    return {f"pimm_fn.{key}": str(value) for key, value in found.items() if isinstance(value, (str, int))}


def _recorded(record: dict) -> str:
    """What the marker let :func:`validate` check beyond readability."""
    files = record.get("files")
    if not isinstance(files, dict):
        return NOT_RECORDED
    digests = sum(1 for entry in files.values() if isinstance(entry, dict) and "sha256" in entry)
    return f"{len(files)} file sizes" + (f" and {digests} SHA-256 digests" if digests else "") + " match the marker"


def _read_every_tensor(path: storage.Location, meta: dict, keep: set) -> tuple[dict, int]:
    """Read every tensor of a ``trainer/`` DCP directory, in batches of bounded size; keep only those in ``keep``.

    Returns:
        ``(kept tensors, bytes read)``.
    """
    kept, read, batch, size = {}, 0, {}, 0
    for key, entry in [*meta.items(), (None, None)]:  # a last, empty entry reads the final batch
        if key is not None:
            batch[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
            size += batch[key].nbytes
        if batch and (key is None or size >= _BATCH_BYTES):
            dcp_reading.load(batch, path)
            kept.update({k: v for k, v in batch.items() if k in keep})
            read, batch, size = read + size, {}, 0
    return kept, read


def _rebuilt(trainer, local) -> None:
    """Decode a loop's saved states as a resume would (a checkpoint of ``save_checkpoint``'s own dicts has none)."""
    if isinstance(trainer, dict) and "state" in trainer and "optimizer" in trainer:
        from_parts(trainer, local)


def _trainer_parts(path: storage.Location, world_size: int) -> tuple[dict, list[str], str]:
    """Read every tensor of ``trainer/`` and unpack each part: ``(parts by prefix, problems, what was read)``.

    Only the skeletons and the numpy values they hold are kept in memory; other tensors
    are read and dropped, their place in the tree taken by their shape.
    """
    meta = dcp_reading.metadata(path).state_dict_metadata
    odd = [k for k, e in meta.items() if not isinstance(e, TensorStorageMetadata)]
    if odd:
        raise ValueError(f"trainer/ entry {odd[0]!r} is not a tensor; pimm_fn writes only tensors")
    prefixes = ["trainer", *(f"local/rank{r}" for r in range(world_size))]
    missing = [p for p in prefixes if f"{p}/skeleton" not in meta]
    skeletons = [f"{p}/skeleton" for p in prefixes if p not in missing]
    first, _ = _read_every_tensor(path, {k: meta[k] for k in skeletons}, set(skeletons))
    texts = {k.removesuffix("/skeleton"): tensor_to_skeleton(v) for k, v in first.items()}
    arrays = {f"{p}/t/{k}" for p, text in texts.items() for k in numpy_keys(text)}
    kept, read = _read_every_tensor(path, meta, arrays)
    shapes = infos_of(meta)
    parts = {}
    for prefix, text in texts.items():
        head = f"{prefix}/t/"
        parts[prefix] = unpack(
            text, {k[len(head) :]: kept.get(k, info) for k, info in shapes.items() if k.startswith(head)}
        )
    problems = [f"trainer/ lacks the {p} part (the checkpoint says {world_size} rank(s) wrote it)" for p in missing]
    shards = sum(1 for k in meta if k.startswith("sharded/"))
    summary = f"trainer/: {len(meta)} tensors read ({read:,} bytes)" + (f", {shards} of them shards" if shards else "")
    return parts, problems, summary


def _standard(path: storage.Location) -> tuple[list[str], list[str]]:
    validate(path, digests=True)  # the marker, then every file it lists: size and SHA-256 (raises on the first)
    record = marker(path)
    notes = []
    if (path / files.WEIGHTS).is_file():
        found = confined(path, files.WEIGHTS)  # never via a link
        source = io.BytesIO(found.read_bytes()) if storage.is_store(found) else found
        weights = torch.load(source, map_location="cpu", weights_only=True)  # every byte
        read = sum(v.nbytes for v in weights.values() if isinstance(v, torch.Tensor))
        notes.append(f"{files.WEIGHTS}: {len(weights)} entries, {read:,} bytes read")
    parts, problems, summary = _trainer_parts(path, record["world_size"])
    for prefix, local in parts.items():
        if prefix != "trainer" and "trainer" in parts:
            _rebuilt(parts["trainer"], local)
    notes.append(f"{summary}, {len(parts) - 1} rank part(s) unpacked")
    return problems, [*notes, _recorded(record)]


def _legacy_file(path: storage.Location) -> tuple[list[str], list[str]]:
    info = one_file.read_info(path)
    content = one_file._load(path, mmap=False)  # every byte read
    trainer = one_file._unpacked(content["trainer"])
    for local in content["local"]:
        _rebuilt(trainer, one_file._unpacked(local))
    entries_read = len(content["weights"])
    return [], [f"one file written atomically; {entries_read} weight entries and {info.world_size} rank(s) read back"]


def _best(path: storage.Location) -> tuple[list[str], list[str]]:
    check_best(path)  # the SHA-256 its .json records, if any (raises)
    weights = one_file._load(path, mmap=False)
    notes = [f"{len(weights)} weight entries read"]
    meta = path.with_suffix(".json")
    try:
        best_record(path)
    except FileNotFoundError:
        notes.append(f"no {meta.name} beside it: which metric and step it holds is not recorded")
    except (OSError, ValueError) as exc:  # a FIFO, a crafted record: damage beside the weights
        return [f"{meta.name} {record_problem(exc)}"], notes
    return [], notes
