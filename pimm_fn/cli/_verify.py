"""``verify``: is each checkpoint complete, does every byte of it read back, do sizes and checksums match.

Every tensor is really read: the weights file with ``torch.load``, the
trainer part through DCP in batches of bounded size, then unpacked into the
values a resume would build. When the marker records the files (``"files":
{relative path: {"size", "sha256"}}``), each size and digest is checked too.
"""

from __future__ import annotations

import pathlib

import attrs
import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from pimm_fn.checkpoint import _layout as L
from pimm_fn.checkpoint import _legacy, safe_reading
from pimm_fn.checkpoint._pack import tensor_to_skeleton, unpack
from pimm_fn.checkpoint._peek import infos_of, numpy_keys
from pimm_fn.checkpoint._retain import marker_of
from pimm_fn.checkpoint.contents import from_parts
from pimm_fn.checkpoint.validation import confined, validate
from pimm_fn.cli import DAMAGED, NOT_FOUND, OK, Failure, emit
from pimm_fn.cli._listing import Entry, entries, entry_of, is_checkpoint_dir, model_dir_of, reason

__all__ = ["Finding", "check", "verify"]

_BATCH_BYTES = 256 * 2**20  # tensors read per DCP load: bounded memory for any checkpoint size
NOT_RECORDED = "sizes and checksums are not recorded in this checkpoint's marker: only readability was checked"


@attrs.frozen
class Finding:
    """What verifying one entry found: ``problems`` make it damaged; ``notes`` say what was checked.

    ``status``: ``"ok"``, ``"note"`` (a leftover that is no checkpoint), ``"incomplete"`` (never
    finished: no marker, or a save in progress) or ``"damaged"`` (finished, then changed or lost).
    """

    name: str
    kind: str
    problems: tuple = ()
    notes: tuple = ()
    incomplete: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def status(self) -> str:
        if self.problems:
            return "incomplete" if self.incomplete else "damaged"
        return "note" if self.kind in ("unfinished", "retired") else "ok"


def _recorded(marker: dict) -> str:
    """What the marker let :func:`validate` check beyond readability."""
    files = marker.get("files")
    if not isinstance(files, dict):
        return NOT_RECORDED
    digests = sum(1 for record in files.values() if isinstance(record, dict) and "sha256" in record)
    return f"{len(files)} file sizes" + (f" and {digests} SHA-256 digests" if digests else "") + " match the marker"


def _read_every_tensor(path: pathlib.Path, meta: dict, keep: set) -> tuple[dict, int]:
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
            safe_reading.load(batch, path)
            kept.update({k: v for k, v in batch.items() if k in keep})
            read, batch, size = read + size, {}, 0
    return kept, read


def _rebuilt(trainer, local) -> None:
    """Decode a loop's saved states as a resume would (a checkpoint of ``save_checkpoint``'s own dicts has none)."""
    if isinstance(trainer, dict) and "state" in trainer and "optimizer" in trainer:
        from_parts(trainer, local)


def _trainer_parts(path: pathlib.Path, world_size: int) -> tuple[dict, list[str], str]:
    """Read every tensor of ``trainer/`` and unpack each part: ``(parts by prefix, problems, what was read)``.

    Only the skeletons and the numpy values they hold are kept in memory; other tensors
    are read and dropped, their place in the tree taken by their shape.
    """
    meta = safe_reading.metadata(path).state_dict_metadata
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
        parts[prefix] = unpack(text, {k[len(head):]: kept.get(k, info) for k, info in shapes.items() if k.startswith(head)})
    problems = [f"trainer/ lacks the {p} part (the checkpoint says {world_size} rank(s) wrote it)" for p in missing]
    shards = sum(1 for k in meta if k.startswith("sharded/"))
    summary = f"trainer/: {len(meta)} tensors read ({read:,} bytes)" + (f", {shards} of them shards" if shards else "")
    return parts, problems, summary


def _standard(path: pathlib.Path) -> tuple[list[str], list[str]]:
    validate(path, digests=True)  # the marker, then every file it lists: size and SHA-256 (raises on the first)
    marker = marker_of(path)
    notes = []
    if (path / L.WEIGHTS).is_file():
        weights = torch.load(confined(path, L.WEIGHTS), map_location="cpu", weights_only=True)  # every byte; never via a link
        read = sum(v.nbytes for v in weights.values() if isinstance(v, torch.Tensor))
        notes.append(f"{L.WEIGHTS}: {len(weights)} entries, {read:,} bytes read")
    parts, problems, summary = _trainer_parts(path, marker["world_size"])
    for prefix, local in parts.items():
        if prefix != "trainer" and "trainer" in parts:
            _rebuilt(parts["trainer"], local)
    notes.append(f"{summary}, {len(parts) - 1} rank part(s) unpacked")
    return problems, [*notes, _recorded(marker)]


def _legacy_file(path: pathlib.Path) -> tuple[list[str], list[str]]:
    info = _legacy.read_info(path)
    content = _legacy._load(path, mmap=False)  # every byte read
    trainer = _legacy._unpacked(content["trainer"])
    for local in content["local"]:
        _rebuilt(trainer, _legacy._unpacked(local))
    entries_read = len(content["weights"])
    return [], [f"one file written atomically; {entries_read} weight entries and {info.world_size} rank(s) read back"]


def _best(path: pathlib.Path) -> tuple[list[str], list[str]]:
    weights = _legacy._load(path, mmap=False)
    notes = [f"{len(weights)} weight entries read"]
    meta = path.with_suffix(".json")
    if not meta.is_file():
        notes.append(f"no {meta.name} beside it: which metric and step it holds is not recorded")
    return [], notes


def check(entry: Entry, *, named: bool = False) -> Finding:
    """Verify one entry; never raises for a damaged checkpoint (the finding says what is wrong).

    An unfinished save is a note in a directory's listing, but a problem when ``named`` on its own.
    """
    if entry.kind == "unfinished":
        text = "unfinished save or removal: never read, the next save removes it"
        return Finding(entry.name, entry.kind, (text,) if named else (), () if named else (text,), incomplete=True)
    try:
        if entry.kind == "best":
            problems, notes = _best(entry.path)
        elif entry.path.is_dir():
            problems, notes = _standard(entry.path)
        else:
            problems, notes = _legacy_file(entry.path)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - any failure to read is the finding
        if entry.kind == "retired" and not named:
            return Finding(entry.name, entry.kind, notes=(f"leftover of an interrupted publish: {reason(exc)}",))
        unmarked = entry.path.is_dir() and not (entry.path / L.MARKER).exists()
        return Finding(entry.name, entry.kind, problems=(reason(exc),), incomplete=unmarked)
    return Finding(entry.name, entry.kind, tuple(problems), tuple(notes))


def _targets(path: pathlib.Path) -> tuple[list[Entry], bool]:
    """The entries to verify, and whether ``path`` named one itself."""
    if not path.exists():
        raise Failure(NOT_FOUND, f"{str(path)!r} does not exist; pass a checkpoint, a save_dir or a model_dir")
    named = entry_of(path)
    if named is not None:
        return [named], True
    if path.is_file() or is_checkpoint_dir(path):
        return [Entry(path, "checkpoint")], True
    found = entries(model_dir_of(path, "verify"))
    if not found:
        raise Failure(NOT_FOUND, f"no checkpoint under {str(path)!r}; pass a checkpoint, a save_dir or a model_dir")
    return found, False


def _text(findings: list[Finding]) -> str:
    width = max(len(f.name) for f in findings)
    lines = []
    for f in findings:
        lines.append(f"{f.status.upper():<10} {f.name.ljust(width)}  " + "; ".join(f.problems or f.notes))
    return "\n".join(lines)


def verify(args) -> int:
    """Verify a checkpoint, or every one under a save_dir/model_dir; exit 1 when any is damaged or incomplete."""
    targets, named = _targets(pathlib.Path(args.path))
    findings = [check(e, named=named) for e in targets]
    data = [{"name": f.name, "kind": f.kind, "status": f.status, "problems": list(f.problems), "notes": list(f.notes)}
            for f in findings]
    emit({"path": args.path, "ok": all(f.ok for f in findings), "entries": data}, _text(findings), args.json)
    damaged = [f.name for f in findings if not f.ok]
    if damaged:
        raise Failure(DAMAGED, f"{len(damaged)} of {len(findings)} damaged or incomplete: {', '.join(damaged)}")
    return OK
