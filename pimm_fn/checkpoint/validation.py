"""Whether a checkpoint on disk can be used, told before it is read, and one that cannot set aside, never deleted.

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
(``loop(saving=Saving(digests=True))``, ``save_checkpoint(..., digests=True)``) and checked
when a validation asks (``validate(..., digests=True)``): ``resume="auto"``,
``resume=<path>`` and the checkpoint CLI's ``verify`` ask whenever the marker
records them, so bytes changed at the same size are caught before they are
trained on. A read of the weights alone (a warm start, ``load_weights_file``)
checks the digests of the files it reads (:func:`check_digests`). Receipts are not listed: loading never reads them.

The names a marker lists are untrusted: each must be a relative path
without ``..`` naming, through real directories (no symbolic link), a
regular file inside the checkpoint directory (:func:`confined`, checked
with ``lstat`` part by part before anything is opened). Any other name
(``../../../dev/zero``, ``/etc/passwd``, a link, a FIFO) makes the marker
damaged: nothing outside the checkpoint is ever stat'ed or read.

A marker written before ``files`` existed is checked as far as it can be:
the weights file and the DCP metadata present and not empty, and each
data file the metadata names (confined alike) at least as long as the
bytes it records there.

A legacy one-file checkpoint is valid when it loads with
``torch.load(weights_only=True)`` (memory-mapped: the tensors stay on disk)
and holds a valid marker.

A checkpoint that does not validate, in the way of a save: moved aside and kept, never deleted or overwritten.

A save takes names an earlier checkpoint may hold: ``last`` (or
``last.pth``) and ``iter_<step>`` (a run resumed from an older snapshot
saves the same steps again). One there that validates is replaced as
before; one that does not (a file cut short or changed since the save, a
lost marker) is the library's to leave alone, since it could not read it:
it is renamed ``damaged-<name>`` (``damaged-<name>-2``, ... when that is
taken), with a :class:`SetAsideWarning` saying where and why. Discovery,
retention and clean-up never look at those names; ``python -m pimm_fn ls``
lists them, and removing or repairing one is the user's call.

On an fsspec store, which has no rename, its objects are copied (server
side) under the new name, its marker last, before the original is deleted.

A set-aside the storage refuses (a directory this user may not rename, an
immutable checkpoint) loses nothing either: the damaged checkpoint stays as
it was, the save that needed its name is not published (its caller removes
what it staged), and a :class:`CheckpointStorageError` says both and how to
go on.
"""

from __future__ import annotations

import contextlib
import os
import stat
import warnings
from typing import Any, cast

from pimm_fn.checkpoint import files, storage
from pimm_fn.checkpoint.errors import CheckpointError, CheckpointStorageError, SetAsideWarning, cause
from pimm_fn.checkpoint.files import CheckpointInfo, digest, info_from_marker
from pimm_fn.checkpoint.formats import dcp_reading, one_file

__all__ = [
    "check_digests",
    "check_files",
    "confined",
    "read_marker",
    "validate",
    "SET_ASIDE",
    "readable_or_set_aside",
    "set_aside",
]


_METADATA = f"{files.TRAINER}/.metadata"


def confined(path: storage.Location, rel: str, *, listed_in: str = files.MARKER) -> storage.Location:
    """``path / rel`` for a name a checkpoint lists about itself, once sure it is a regular file inside ``path``.

    ``rel`` must be a relative POSIX path of plain parts (no ``..``, ``.``,
    empty part, backslash or NUL); each part is ``lstat``-ed in turn (a
    link is never followed): the leading ones must be directories, the last
    a regular file. So a crafted or damaged marker cannot make a reader
    stat, open or hang on anything outside the checkpoint (``/dev/zero``,
    a FIFO, another user's file).

    Raises:
        CheckpointError: ``listed_in`` (the marker) is damaged, naming the
            entry and why; or the file is missing or unreadable, naming it.
    """
    parts = _plain_parts(path, rel, listed_in)
    if storage.is_store(path):  # no links, FIFOs or devices on a store: the name's syntax was what mattered
        if not (path / rel).is_file():
            raise CheckpointError(path, rel, "is missing")
        return path / rel
    here = path
    for i, part in enumerate(parts):
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            raise CheckpointError(path, rel, "is missing") from None
        except OSError as exc:
            raise CheckpointError(path, rel, f"cannot be read ({cause(exc)})") from None
        wanted, kind = (stat.S_ISREG, "a regular file") if i == len(parts) - 1 else (stat.S_ISDIR, "a directory")
        if stat.S_ISLNK(mode) or not wanted(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not " + kind
            problem = (
                f"lists {rel!r:.200}, whose {part!r:.80} is {what}: only regular files inside the "
                "checkpoint directory count (a damaged or crafted marker)"
            )
            raise CheckpointError(path, listed_in, problem)
    return here


def _plain_parts(path: storage.Location, rel: object, listed_in: str) -> list[str]:
    """The parts of ``rel``, a name the checkpoint ``path`` lists, once sure it is a plain relative POSIX path."""
    parts = rel.split("/") if isinstance(rel, str) else []  # never empty for a str: "".split("/") is [""]
    if (
        not isinstance(rel, str)
        or rel.startswith("/")
        or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts)
    ):
        raise CheckpointError(
            path,
            listed_in,
            f"lists {rel!r:.200}, which is not a plain relative path inside the "
            "checkpoint directory: a damaged or crafted marker",
        )
    return parts


def validate(path: str | os.PathLike[str] | storage.StorePath, *, digests: bool = False) -> CheckpointInfo:
    """The info of a usable checkpoint (a standard directory or a legacy file), checked as the module says.

    With ``digests`` each file whose marker entry records a SHA-256 is read
    and hashed too (a checkpoint saved without digests is checked by size).

    Raises:
        CheckpointError: naming the checkpoint, the damaged file and what is wrong.

    Example:
        >>> import tempfile
        >>> validate(tempfile.mkdtemp())
        Traceback (most recent call last):
        pimm_fn.checkpoint.errors.CheckpointError: checkpoint ...: COMPLETE is missing...
    """
    path = storage.location(path)
    if path.is_file():
        return one_file.read_info(path)
    info, payload = read_marker(path)
    check_files(path, payload, digests)
    return info


def read_marker(path: storage.Location) -> tuple[CheckpointInfo, dict[str, Any]]:
    """The info and payload of ``path``'s ``COMPLETE`` marker, read as untrusted input (:mod:`pimm_fn.checkpoint.files`)."""
    try:
        payload = files.read_json(path / files.MARKER)
    except FileNotFoundError:
        problem = "is missing (no COMPLETE marker): it was never finished, or is not a checkpoint"
        raise CheckpointError(path, files.MARKER, problem) from None
    except files.NotRegularFileError as exc:
        raise CheckpointError(path, files.MARKER, f"{exc.strerror}: a damaged or crafted checkpoint") from None
    except OSError as exc:
        raise CheckpointError(path, files.MARKER, f"cannot be read ({cause(exc)})") from None
    except ValueError as exc:
        problem = f"is not valid JSON ({exc}): it was cut short, overwritten or crafted"
        raise CheckpointError(path, files.MARKER, problem) from None
    try:
        info = info_from_marker(path, payload, "standard")
    except ValueError as exc:
        raise CheckpointError(path, files.MARKER, f"is not a valid marker ({exc})") from None
    return info, cast("dict[str, Any]", payload)  # info_from_marker refused anything but a JSON object


def check_files(path: storage.Location, payload: dict[str, Any], digests: bool) -> None:
    """Every file the marker ``payload`` lists is in ``path`` at its recorded size (and SHA-256, with ``digests``)."""
    recorded = payload.get("files")
    if recorded is None:
        _check_unlisted(path)
        return
    if not isinstance(recorded, dict) or not all(_is_record(r) for r in recorded.values()):
        raise CheckpointError(path, files.MARKER, "has a malformed 'files' entry (expected {path: {'size': int}})")
    weights = files.WEIGHTS_SKIPPED if files.WEIGHTS_SKIPPED in recorded else files.WEIGHTS
    for needed in (weights, _METADATA):
        if needed not in recorded:
            raise CheckpointError(path, files.MARKER, f"lists no {needed}: it is not a pimm_fn checkpoint marker")
    listing = (
        path.files() if storage.is_store(path) else None
    )  # on a store every size in one listing, not a request a file
    for rel, record in recorded.items():
        _check_file(path, rel, record, digests, listing)


def _is_record(record: object) -> bool:
    size = record.get("size") if isinstance(record, dict) else None
    return isinstance(size, int) and not isinstance(size, bool) and size >= 0


def _check_file(
    path: storage.Location, rel: str, record: dict[str, Any], digests: bool, listing: dict[str, int] | None = None
) -> None:
    size = _size(path, rel) if listing is None else _listed_size(path, rel, listing)
    if size != record["size"]:
        how = "cut short" if size < record["size"] else "grown since the save"
        raise CheckpointError(path, rel, f"is {size:,} bytes, the marker records {record['size']:,} ({how})")
    if digests:
        _check_digest(path, rel, record)


def check_digests(path: storage.Location, under: str) -> None:
    """The files of checkpoint ``path`` at or under ``under`` match the SHA-256 its marker records for them.

    For a read of part of a checkpoint (its weights) that ``validate`` checked
    by size: only what is read is hashed. A file the marker records no digest
    for (a save without digests) passes.

    Raises:
        CheckpointError: naming the file whose bytes changed since the save.
    """
    files = read_marker(path)[1].get("files")
    for rel, record in files.items() if isinstance(files, dict) else ():
        if (rel == under or rel.startswith(f"{under}/")) and _is_record(record):
            _check_digest(path, rel, record)


def _check_digest(path: storage.Location, rel: str, record: dict[str, Any]) -> None:
    if "sha256" in record and _digest(path, rel) != record["sha256"]:
        raise CheckpointError(
            path, rel, "does not match the SHA-256 its marker records: its bytes changed since the save"
        )


def _size(path: storage.Location, rel: str, listed_in: str = files.MARKER) -> int:
    try:
        return confined(path, rel, listed_in=listed_in).stat().st_size
    except OSError as exc:
        raise CheckpointError(path, rel, f"cannot be read ({cause(exc)})") from None


def _listed_size(path: storage.Location, rel: str, listing: dict[str, int]) -> int:
    """The size of ``rel`` in the one listing of a checkpoint on a store (``StorePath.files``), as ``_size`` gives it."""
    _plain_parts(path, rel, files.MARKER)  # no links, FIFOs or devices on a store: the name's syntax is what matters
    if rel not in listing:
        raise CheckpointError(path, rel, "is missing")
    return listing[rel]


def _digest(path: storage.Location, rel: str) -> str:
    try:
        return digest(confined(path, rel))
    except OSError as exc:
        raise CheckpointError(path, rel, f"cannot be read ({cause(exc)})") from None


def _check_unlisted(path: storage.Location) -> None:
    """A marker without ``files`` (written before sizes were recorded): what can be checked without them."""
    weights = files.WEIGHTS_SKIPPED if (path / files.WEIGHTS_SKIPPED).is_file() else files.WEIGHTS
    for needed in (weights, _METADATA):
        if _size(path, needed) == 0:
            raise CheckpointError(path, needed, "is empty (0 bytes)")
    for rel, extent in _data_extents(path).items():
        size = _size(path, rel, _METADATA)
        if size < extent:
            problem = f"is {size:,} bytes, but {_METADATA} places data up to byte {extent:,} (cut short)"
            raise CheckpointError(path, rel, problem)


def _data_extents(path: storage.Location) -> dict[str, int]:
    """``{data file: bytes it must hold at least}``, from the DCP metadata of ``path``'s ``trainer/``."""
    extents: dict[str, int] = {}
    for info in (dcp_reading.metadata(path).storage_data or {}).values():
        rel = f"{files.TRAINER}/{info.relative_path}"
        extents[rel] = max(extents.get(rel, 0), info.offset + info.length)
    return extents


SET_ASIDE = "damaged-"


def readable_or_set_aside(path: storage.Location, *, otherwise: str) -> CheckpointInfo | None:
    """The info of the checkpoint at ``path`` when it validates; else it is set aside (said) and ``None``.

    Args:
        otherwise: what the save that writes ``path`` comes to when the set-aside
            is refused ("the checkpoint of step 8 is not published ..."), for the error.

    Raises:
        CheckpointStorageError: the storage refused the set-aside; the damaged checkpoint is left as it was.
    """
    try:
        return validate(path)
    except CheckpointError as exc:
        damaged = exc
    try:
        kept = set_aside(path)
    except OSError as refused:
        raise CheckpointStorageError(
            f"{damaged.summary()}. A save writes {path.name} now, so that checkpoint was to be kept as "
            f"{_free_name(path)}, which the storage refused ({cause(refused)}): it is left as it was, and "
            f"{otherwise}. Move {path} out of the way yourself (or make {path.parent} writable), then continue with "
            f"resume='auto', which skips damaged checkpoints"
        ) from refused
    warnings.warn(
        f"{damaged.summary()}: a save writes {path.name} now, so the checkpoint there is kept as {kept.name}, "
        f"never deleted. `python -m pimm_fn verify {kept}` says what is wrong; repair it, or remove it yourself",
        SetAsideWarning,
        stacklevel=2,
    )
    return None


def set_aside(path: storage.Location) -> storage.Location:
    """Move the checkpoint at ``path`` to the first free ``damaged-<name>[-<n>]`` beside it; returns where.

    Raises:
        OSError: the storage refused; ``path`` is as it was (a store's partial copy, invisible without its marker, removed).
    """
    name = _free_name(path)
    if storage.is_store(path):
        copied = path.parent / name
        try:
            files.copy_on_store(path, copied)
        except BaseException:
            with contextlib.suppress(OSError):  # the refusal that stopped the copy may refuse this too
                files.remove(copied)
            raise
        files.remove(path)
        return copied
    target = path.parent / name
    os.rename(path, target)
    return target


def _free_name(path: storage.Location) -> str:
    """The first ``damaged-<name>[-<n>]`` free beside ``path``."""
    suffix = path.suffix if path.suffix == ".pth" else ""
    stem = path.name[: len(path.name) - len(suffix)]
    target, n = path.parent / f"{SET_ASIDE}{stem}{suffix}", 2
    while target.exists():
        target, n = path.parent / f"{SET_ASIDE}{stem}-{n}{suffix}", n + 1
    return target.name
