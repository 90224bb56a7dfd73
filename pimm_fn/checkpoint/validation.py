"""Whether a checkpoint on disk can be used, told before it is read: the one place discovery asks.

A standard checkpoint directory is valid when its ``COMPLETE`` marker
parses and every file the marker lists is present with the recorded size
(and, when asked, the recorded SHA-256). The save records them, rank 0
listing the staging directory after every rank's files are written (after
the receipts check), so DCP's data files of all ranks, a sharded model's
shards and ``model.pth.skipped`` are all in it::

    "files": {"model.pth": {"size": 1234, "sha256": "9f86…"},      # sha256 only with digests=True
              "trainer/.metadata": {"size": 567},
              "trainer/__0_0.distcp": {"size": 8910}, ...}

Sizes cost a ``stat`` each; digests are recorded when a save asks for them
and checked when a validation asks (``validate(..., digests=True)``, the
checkpoint CLI's ``verify``). Receipts are not listed: loading never reads
them. A marker written before ``files`` existed is checked as far as it
can be: the weights file and the DCP metadata present and not empty, and
each data file the metadata names at least as long as the bytes it
records there.

A legacy one-file checkpoint is valid when it loads with
``torch.load(weights_only=True)`` (memory-mapped: the tensors stay on disk)
and holds a valid marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import attrs

from . import _layout as L
from . import _legacy
from ._layout import CheckpointInfo
from ._standard import data_extents
from .errors import CheckpointError, cause

__all__ = ["Candidate", "candidates", "manifest", "validate"]

_METADATA = f"{L.TRAINER}/.metadata"


def manifest(directory: pathlib.Path, *, digests: bool = False) -> dict:
    """The marker's ``files`` entry for a finished checkpoint directory: ``{relative path: {"size", ["sha256"]}}``."""
    files = {}
    for path in sorted(pathlib.Path(directory).rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if rel == L.MARKER or rel.startswith(f"{L.RECEIPTS}/") or not path.is_file():
            continue
        files[rel] = {"size": path.stat().st_size, **({"sha256": _sha256(path)} if digests else {})}
    return files


def validate(path: str | os.PathLike, *, digests: bool = False) -> CheckpointInfo:
    """The info of a usable checkpoint (a standard directory or a legacy file), checked as the module says.

    Raises:
        CheckpointError: naming the checkpoint, the damaged file and what is wrong.

    Example:
        >>> import tempfile
        >>> validate(tempfile.mkdtemp())
        Traceback (most recent call last):
        pimm_fn.checkpoint.errors.CheckpointError: checkpoint ...: COMPLETE is missing...
    """
    path = pathlib.Path(path)
    if path.is_file():
        return _legacy.read_info(path)
    info, payload = _marker(path)
    _check_files(path, payload, digests)
    return info


@attrs.frozen
class Candidate:
    """One entry of a model_dir that could be resumed from: usable (``info``) or not (``error``).

    Attributes:
        path: the checkpoint directory or legacy file.
        step: its step: from the marker, else from the name (``iter_<step>``); ``None`` when unknown.
        info: the checkpoint, when it validates.
        error: why it does not, otherwise.
        priority: how it ranks among entries of one step: 2 ``last``, 1 a snapshot, 0 a retired copy.
    """

    path: pathlib.Path
    step: int | None
    info: CheckpointInfo | None = None
    error: CheckpointError | None = None
    priority: int = 0


def candidates(model_dir: str | os.PathLike) -> list[Candidate]:
    """Every checkpoint under ``model_dir``, usable or not, newest first (local, no collectives).

    Newest means the highest step; a damaged ``last`` whose step is unknown
    counts as the newest. On a tie ``last`` beats a snapshot, which beats a
    retired copy, and the standard format beats the legacy one.
    ``.staging-*`` entries are never looked at, nor retired copies whose
    marker is gone (a deletion under way).
    """
    root = pathlib.Path(model_dir)
    if not root.is_dir():
        return []
    found = [c for c in map(_examine, root.iterdir()) if c is not None]
    key = lambda c: (float("inf") if c.step is None else c.step, c.priority, c.path.is_dir(), c.path.name)
    return sorted(found, key=key, reverse=True)


def _examine(entry: pathlib.Path) -> Candidate | None:
    priority = _priority(entry)
    if priority is None:
        return None
    if not entry.is_dir():
        try:
            info = _legacy.read_info(entry)
        except CheckpointError as exc:
            return Candidate(entry, _named_step(entry), error=exc, priority=priority)
        return Candidate(entry, info.step, info, priority=priority)
    try:
        info, payload = _marker(entry)
    except CheckpointError as exc:
        return None if priority == 0 else Candidate(entry, _named_step(entry), error=exc, priority=priority)
    try:
        _check_files(entry, payload, False)
    except CheckpointError as exc:
        return Candidate(entry, info.step, error=exc, priority=priority)
    return Candidate(entry, info.step, info, priority=priority)


def _priority(entry: pathlib.Path) -> int | None:
    name = entry.name
    if name.startswith(L.STAGING):
        return None
    if entry.is_dir():
        if name == L.LAST:
            return 2
        if L.ITER_DIR.match(name):
            return 1
        return 0 if name.startswith(L.RETIRED) else None
    if name == L.LEGACY_LAST:
        return 2
    return 1 if L.ITER_FILE.match(name) else None


def _named_step(entry: pathlib.Path) -> int | None:
    match = (L.ITER_DIR if entry.is_dir() else L.ITER_FILE).match(entry.name)
    return int(match.group(1)) if match else None


def _marker(path: pathlib.Path) -> tuple[CheckpointInfo, dict]:
    """The info and payload of ``path``'s ``COMPLETE`` marker."""
    try:
        text = (path / L.MARKER).read_text(encoding="utf-8")
    except FileNotFoundError:
        problem = "is missing (no COMPLETE marker): it was never finished, or is not a checkpoint"
        raise CheckpointError(path, L.MARKER, problem) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, L.MARKER, f"cannot be read ({cause(exc)})") from None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(path, L.MARKER, f"is not valid JSON ({exc}): it was cut short or overwritten") from None
    try:
        return L.info_from_marker(path, payload, "standard"), payload
    except ValueError as exc:
        raise CheckpointError(path, L.MARKER, f"is not a valid marker ({exc})") from None


def _check_files(path: pathlib.Path, payload: dict, digests: bool) -> None:
    files = payload.get("files")
    if files is None:
        _check_unlisted(path)
        return
    if not isinstance(files, dict) or not all(_is_record(r) for r in files.values()):
        raise CheckpointError(path, L.MARKER, "has a malformed 'files' entry (expected {path: {'size': int}})")
    weights = L.WEIGHTS_SKIPPED if L.WEIGHTS_SKIPPED in files else L.WEIGHTS
    for needed in (weights, _METADATA):
        if needed not in files:
            raise CheckpointError(path, L.MARKER, f"lists no {needed}: it is not a pimm_fn checkpoint marker")
    for rel, record in files.items():
        _check_file(path, rel, record, digests)


def _is_record(record) -> bool:
    size = record.get("size") if isinstance(record, dict) else None
    return isinstance(size, int) and not isinstance(size, bool) and size >= 0


def _check_file(path: pathlib.Path, rel: str, record: dict, digests: bool) -> None:
    size = _size(path, rel)
    if size != record["size"]:
        how = "cut short" if size < record["size"] else "grown since the save"
        raise CheckpointError(path, rel, f"is {size:,} bytes, the marker records {record['size']:,} ({how})")
    if digests and "sha256" in record and _sha256(path / rel) != record["sha256"]:
        raise CheckpointError(path, rel, "does not match the SHA-256 its marker records: its bytes changed since the save")


def _size(path: pathlib.Path, rel: str) -> int:
    try:
        return (path / rel).stat().st_size
    except FileNotFoundError:
        raise CheckpointError(path, rel, "is missing") from None
    except OSError as exc:
        raise CheckpointError(path, rel, f"cannot be read ({cause(exc)})") from None


def _check_unlisted(path: pathlib.Path) -> None:
    """A marker without ``files`` (written before sizes were recorded): what can be checked without them."""
    weights = L.WEIGHTS_SKIPPED if (path / L.WEIGHTS_SKIPPED).is_file() else L.WEIGHTS
    for needed in (weights, _METADATA):
        if _size(path, needed) == 0:
            raise CheckpointError(path, needed, "is empty (0 bytes)")
    for rel, needed in data_extents(path).items():
        size = _size(path, rel)
        if size < needed:
            problem = f"is {size:,} bytes, but {_METADATA} places data up to byte {needed:,} (cut short)"
            raise CheckpointError(path, rel, problem)


def _sha256(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
