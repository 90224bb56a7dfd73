"""A checkpoint's files on disk: their names, the marker that commits them and what it records, written and read safely, probed before the first save.

How the files are written so that a crash never leaves one that looks whole
(atomic, staged and background writes, the marker last): :mod:`pimm_fn.checkpoint.files`.
What the marker records, and the ``CheckpointInfo`` read back from it: :mod:`pimm_fn.checkpoint.files`.

Layout under a ``model_dir`` (``save_dir/"model"``)::

    last/                   rolling checkpoint, standard format
      model.pth             model weights (torch.save of the full state_dict); a sharded
                            model saved without it has model.pth.skipped instead
      trainer/              torch.distributed.checkpoint directory
      receipts/rank<r>      JSON: rank r wrote its part here (rank, world size, host)
      COMPLETE              JSON marker, written last: step, world size, each file's size
    iter_<step>/            snapshot of a published ``last/`` (hard links)
    last.pth, iter_<step>.pth   the same, legacy one-file format
    model_best.pth (+ .json)    best weights and what made them best
    model_best_<metric>.pth (+ .json)   the same per metric, when several are tracked
    .staging-*              being written; never read, removed at next save
    .retired-*              the previous ``last/`` during a publish
    damaged-*               a checkpoint a save found damaged where it writes, kept (:mod:`pimm_fn.checkpoint.validation`)

On an fsspec store (``save_dir="s3://..."``, :mod:`.storage`), which has no
atomic rename, the rolling checkpoint is written under its final name
``last-<step>-<token>/`` and ``COMPLETE`` is written last: a directory
without it is invisible (being written, or left by a crash) and the next
publish deletes it; the previous ``last-*`` is deleted, marker first, once
the new one is committed (:mod:`pimm_fn.checkpoint.publish`).

Invariant: a directory counts as a checkpoint only when its ``COMPLETE``
marker parses and every file it lists has the recorded size
(:mod:`.validation`); the marker is written after every file.

Reading a small file under a ``save_dir`` (a marker, a best-model record, a lock) as the untrusted input it is.

Anything under a ``save_dir`` may be damaged or crafted. A FIFO in place of
``COMPLETE`` once made ``resume="auto"`` and ``ls`` wait forever, and
``"[" * 100000`` made them fail with a ``RecursionError``. So these reads
take only a regular file: never through a symbolic link, never blocking on
a FIFO, never opening a device, and at most ``limit`` bytes of it; JSON
nested too deeply is a ``ValueError`` like any other malformed JSON
(:mod:`pimm_fn.core.untrusted_json`). An
fsspec store's object (a store has no links, FIFOs or devices) is read as
it is.

Every reader here raises:

- ``FileNotFoundError``: the file is not there.
- :class:`NotRegularFileError` (an ``OSError``): a link, FIFO, device or
  directory where the file belongs: never followed, opened or read.
- ``OSError``: the file cannot be read.
- ``ValueError``: it is larger than ``limit``, or (text, JSON) does not decode.

What a checkpoint's ``COMPLETE`` marker records, and the ``CheckpointInfo`` read back from it.

The marker (written last, by :func:`pimm_fn.checkpoint.files.write_marker`) holds the
step, the format, the world size and a version; legacy one-file
checkpoints embed the same payload. :func:`info_from_marker` checks one
and names what is wrong: a marker that does not check out is a damaged
checkpoint (:mod:`.validation`).

What a save records of its files in the marker: each one's size and, when asked, its SHA-256.

Rank 0 lists the staging directory once every rank's files are written
(``manifest``); the weights file's digest is computed as it is written
(``pimm_fn.checkpoint.files.BackgroundWrite``), every other file is read once, in
parallel. :mod:`.validation` checks the record before a checkpoint is used,
hashing with the same ``digest``.

Writing a checkpoint's files so that a crash never leaves one that looks whole.

A file replaced atomically (a temp name, then ``os.replace``), staged under
a ``.staging-`` name for the caller to rename, written and fsynced in place
inside a directory nobody reads yet, or on its own thread beside DCP (the
weights file, hashed as it is written); and the ``COMPLETE`` marker, written
after every other file (:mod:`pimm_fn.checkpoint.files` names them).

Whether a save can write where it writes, asked before the first step rather than found at the first save.

A save creates a staging directory and files in ``model/``, renames it into
place and deletes what it replaces; a ``model/`` this user may not write
(its permissions, a read-only mount, an immutable flag) would fail there,
hours into training. :func:`check_writable` has every rank that writes do
the same once, on a probe (a ``.staging-probe-*`` directory holding one
file, renamed, then deleted; one a crash left, the next save removes), and
every rank raises the same :class:`CheckpointStorageError`, naming each
rank that could not, its host, the path and the OS's reason, before any
step trains. Which ranks write: rank 0 for the legacy format and the best
weights; every rank for the standard format (DCP writes each rank's part).

On an fsspec store (``s3://``) a probe is a small object written under
``model/`` and deleted (a store has no rename; the store's own refusal, a
missing bucket or credentials that may only read, shows there).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pathlib
import re
import secrets
import shutil
import socket
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Callable

import attrs
import torch

from pimm_fn import dist
from pimm_fn.checkpoint import storage
from pimm_fn.checkpoint.errors import CheckpointStorageError, NotRegularFileError, cause, unwritable_advice
from pimm_fn.core import untrusted_json

__all__ = [
    "best_stem",
    "is_best_name",
    "remove",
    "link_or_copy",
    "copy_on_store",
    "MAX_BYTES",
    "open_regular",
    "read_bytes",
    "read_json",
    "read_text",
    "CheckpointInfo",
    "marker_payload",
    "info_from_marker",
    "FORMATS",
    "VERSION",
    "SAVED_FOR",
    "digest",
    "manifest",
    "fsync_dir",
    "atomic_write",
    "staged_write",
    "durable_write",
    "hashed",
    "BackgroundWrite",
    "weights_write",
    "write_marker",
    "check_writable",
    "probe",
]


LAST = "last"


LEGACY_LAST = "last.pth"


MARKER = "COMPLETE"


WEIGHTS = "model.pth"


# Stands in for the weights file of a sharded model saved without it: says where the weights are.
WEIGHTS_SKIPPED = "model.pth.skipped"


TRAINER = "trainer"


BEST = "model_best.pth"


BEST_META = "model_best.json"


RECEIPTS = "receipts"


def best_stem(metric: str | None = None) -> str:
    """``model_best``, or ``model_best_<metric>`` (unsafe characters as ``_``) when one file per metric is kept.

    >>> best_stem(), best_stem("val/mIoU")
    ('model_best', 'model_best_val_mIoU')
    """
    if metric is None:
        return "model_best"
    return "model_best_" + re.sub(r"[^A-Za-z0-9_.-]", "_", metric)


STAGING = ".staging-"


RETIRED = ".retired-"


ITER_DIR = re.compile(r"^iter_(\d+)$")


ITER_FILE = re.compile(r"^iter_(\d+)\.pth$")


STORE_LAST = re.compile(r"^last-(\d+)-[0-9a-f]+$")  # the rolling checkpoint on a store, under its final name


def is_best_name(path: storage.Location) -> bool:
    """Whether ``path`` is named as a best-model weights file: ``model_best.pth`` or ``model_best_<metric>.pth``."""
    return path.suffix == ".pth" and path.stem.startswith(best_stem())


def remove(path: storage.Location) -> None:
    """Delete a checkpoint dir or file; the marker goes first.

    Removing the marker first means a crash half-way through leaves a
    directory that discovery already ignores.
    """
    if storage.is_store(path):
        (path / MARKER).unlink(missing_ok=True)
        path.remove_tree()
        return
    if path.is_dir() and not path.is_symlink():
        (path / MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def link_or_copy(src: str, dst: str) -> None:
    """Hard-link ``src`` to ``dst``; copy where links are not supported."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def copy_on_store(source: storage.StorePath, target: storage.StorePath) -> None:
    """Copy a checkpoint directory on an fsspec store to ``target`` (server-side copies), its marker last, if any.

    The marker commits on a store: until it is copied, ``target`` is invisible.
    """
    listed = source.files()  # one listing: the marker is in it when there is one
    files = sorted(rel for rel in listed if rel != MARKER)
    if files:
        source.fs.copy([f"{source.path}/{rel}" for rel in files], [f"{target.path}/{rel}" for rel in files])
    if MARKER in listed:
        source.fs.copy(f"{source.path}/{MARKER}", f"{target.path}/{MARKER}")


MAX_BYTES = 16 * 2**20


"""The default ``limit``: far above any marker, record or lock pimm_fn writes, far below what could exhaust memory."""


_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_unless_regular(path: str | os.PathLike[str], mode: int) -> None:
    """Raise :class:`NotRegularFileError` naming what ``path`` is, unless ``mode`` is a regular file's."""
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise NotRegularFileError(errno.EINVAL, f"is {kind}, not a regular file", str(path))


def open_regular(path: str | os.PathLike[str]) -> io.BufferedReader:
    """``path`` opened for reading once sure it is a regular file: a link, FIFO or device is never opened.

    The ``lstat`` before the open keeps devices and FIFOs unopened; the flags
    and the ``fstat`` after it refuse one swapped in between (no wait on a FIFO).

    >>> import pathlib, tempfile
    >>> fifo = pathlib.Path(tempfile.mkdtemp()) / "COMPLETE"
    >>> os.mkfifo(fifo)
    >>> open_regular(fifo)
    Traceback (most recent call last):
    pimm_fn.checkpoint.errors.NotRegularFileError: [Errno 22] is a FIFO, not a regular file: '...COMPLETE'
    """
    _refuse_unless_regular(path, os.lstat(path).st_mode)
    fd = os.open(path, _FLAGS)
    try:
        _refuse_unless_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def read_bytes(path: str | os.PathLike[str] | storage.StorePath, *, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path``, refused past ``limit`` bytes (a store's object read as it is)."""
    if storage.is_store(path):
        data = path.read_bytes()
    else:
        with open_regular(path) as f:
            data = f.read(limit + 1)  # one byte over tells "too large" without reading the rest
    if len(data) > limit:
        raise ValueError(f"over {limit:,} bytes: far more than such a file holds")
    return data


def read_text(path: str | os.PathLike[str] | storage.StorePath, *, limit: int = MAX_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (``UnicodeDecodeError`` is a ``ValueError``)."""
    return read_bytes(path, limit=limit).decode("utf-8")


def read_json(path: str | os.PathLike[str] | storage.StorePath, *, limit: int = MAX_BYTES) -> object:
    """The JSON value the regular file ``path`` holds; malformed or too deeply nested JSON is a ``ValueError``.

    >>> import pathlib, tempfile
    >>> deep = pathlib.Path(tempfile.mkdtemp()) / "model_best.json"
    >>> _ = deep.write_text("[" * 100000)
    >>> read_json(deep)
    Traceback (most recent call last):
    ValueError: nested too deeply to parse
    """
    return untrusted_json.loads(read_bytes(path, limit=limit))


FORMATS = ("standard", "legacy")


VERSION = 1


SAVED_FOR = (
    "__saved_for__"  # save_checkpoint(saved_for=) travels to the marker among the metrics, then is its own field
)


def _non_negative(_inst, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"CheckpointInfo.{attribute.name} must be an int >= 0 (got {value!r})")


def _positive(_inst, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"CheckpointInfo.{attribute.name} must be an int >= 1 (got {value!r})")


def _known_format(_inst, attribute, value) -> None:
    if value not in FORMATS:
        raise ValueError(f"CheckpointInfo.{attribute.name} must be one of {FORMATS} (got {value!r})")


@attrs.frozen
class CheckpointInfo:
    """Where a complete checkpoint lives and what it holds.

    Attributes:
        path: the checkpoint directory (standard) or file (legacy).
        step: the global step it was saved at.
        format: ``"standard"`` or ``"legacy"``.
        world_size: how many ranks wrote it (their rank-local parts).

    Example:
        >>> CheckpointInfo("runs/x/model/last", 10, "standard", 2).path.name
        'last'
    """

    path: storage.Location = attrs.field(converter=storage.location)
    step: int = attrs.field(validator=_non_negative)
    format: str = attrs.field(validator=_known_format)
    world_size: int = attrs.field(validator=_positive)


def marker_payload(step: int, fmt: str, world_size: int, metrics: dict | None = None) -> dict:
    """The marker's content; also embedded in legacy files.

    ``metrics``: the run's finite metrics at the save, kept for retention
    policies (``keep_best``) and ``python -m pimm_fn ls`` to read cheaply.
    Under ``SAVED_FOR`` they may carry why a save no hook asked for was made
    (``"SIGTERM"``, ``"max_time"``: a preemption save), recorded as the
    marker's own ``saved_for`` field.
    """
    payload = {"step": step, "format": fmt, "world_size": world_size, "version": VERSION}
    if metrics is not None:
        metrics = dict(metrics)
        saved_for = metrics.pop(SAVED_FOR, None)
        payload["metrics"] = metrics
        if saved_for is not None:
            payload["saved_for"] = str(saved_for)
    return payload


def info_from_marker(path: storage.Location, payload: object, fmt: str) -> CheckpointInfo:
    """Validate a marker payload; raise ``ValueError`` saying what is wrong."""
    if not isinstance(payload, dict):
        raise ValueError(f"marker must be a JSON object, got {type(payload).__name__}")
    if payload.get("version") != VERSION or payload.get("format") != fmt:
        raise ValueError(
            f"marker must have version={VERSION}, format={fmt!r} "
            f"(got version={payload.get('version')!r}, format={payload.get('format')!r})"
        )
    # As the JSON has them: CheckpointInfo's validators refuse what is not a count.
    step: Any = payload.get("step")
    world_size: Any = payload.get("world_size")
    try:
        return CheckpointInfo(path, step, fmt, world_size)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"marker is invalid: {exc}") from None


_BLOCK = 8 * 2**20  # bytes hashed per read: large blocks, one pass over each file


def digest(path: str | os.PathLike[str] | storage.StorePath) -> str:
    """The SHA-256 of a file, hex: streamed in large blocks through one reused buffer (any file size, bounded memory).

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
    >>> _ = path.write_bytes(b"abc")
    >>> digest(path)[:16]
    'ba7816bf8f01cfea'
    """
    sha, buffer = hashlib.sha256(), bytearray(_BLOCK)
    view = memoryview(buffer)
    # A store's object is streamed as it is; a local file only when regular: never through a link, never
    # blocking on a FIFO swapped in after a check (a NotRegularFileError, an OSError, instead).
    with path.open("rb") if storage.is_store(path) else open_regular(path) as f:
        while n := f.readinto(buffer):
            sha.update(view[:n])  # hashlib releases the GIL for large updates: the training thread runs on
    return sha.hexdigest()


def manifest(directory: storage.Location, *, digests: bool = False, known: dict | None = None) -> dict:
    """The marker's ``files`` entry for a finished checkpoint directory: ``{relative path: {"size", ["sha256"]}}``.

    ``known``: ``{relative path: SHA-256}`` already computed while writing
    (the weights file's); every other file is read once to hash it. On an
    fsspec store one listing gives every size.
    """
    directory = storage.location(directory)
    if storage.is_store(directory):
        sizes = dict(sorted(directory.files().items()))
    else:
        found = (p for p in sorted(directory.rglob("*")) if p.is_file())
        sizes = {p.relative_to(directory).as_posix(): p.stat().st_size for p in found}
    listed = [rel for rel in sizes if rel != MARKER and not rel.startswith(f"{RECEIPTS}/")]
    files = {rel: {"size": sizes[rel]} for rel in listed}
    if digests:
        known = dict(known or {})
        todo = [rel for rel in listed if not known.get(rel)]
        # One file per thread (hashlib releases the GIL): a checkpoint of many ranks' data files hashes in parallel.
        with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1, 4))) as pool:
            known.update(zip(todo, pool.map(digest, [directory / rel for rel in todo])))
        for rel, record in files.items():
            record["sha256"] = known[rel]
    return files


_SKIPPED_NOTE = (
    b"This checkpoint has no model.pth: it was saved from a sharded model with loop(saving=Saving(weights_file=False)).\n"
    b"The weights are the sharded/model/ entries of trainer/ (a DCP directory);\n"
    b"pimm_fn.checkpoint.load_weights_file('<this directory>') assembles them into a full state dict.\n"
)


def fsync_dir(path: storage.Location) -> None:
    """Make renames inside ``path`` durable (best effort where unsupported; nothing to do on a store)."""
    if storage.is_store(path):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: pathlib.Path, write: Callable[[BinaryIO], object]) -> pathlib.Path:
    """Write a file via a temp name in the same directory, then ``os.replace``.

    Args:
        path: the final file name.
        write: called with a binary file object to fill.

    Returns:
        ``path``; readers see either the old file or the complete new one,
        with the permissions ``open()`` gives (the umask's, see :func:`staged_write`).
    """
    tmp = staged_write(path, write)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def staged_write(path: pathlib.Path, write: Callable[[BinaryIO], object]) -> pathlib.Path:
    """Write ``path``'s content durably under a fresh ``.staging-<name>.<random>`` name beside it; return that name.

    The one way pimm_fn makes a file that is renamed into place (the caller
    ``os.replace``-s it): created as ``open()`` creates files, mode 0666 less
    the umask (0644 under umask 022), so best weights, exports and legacy
    checkpoints are as readable as every other file of the run, never
    ``mkstemp``'s 0600. On failure the temp file is removed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.parent / f"{STAGING}{path.name}.{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, flags, 0o666)  # the kernel applies the umask, as for open(path, "wb")
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name for {path} after 100 tries")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def durable_write(path: storage.Location, write: Callable[[BinaryIO], object]) -> storage.Location:
    """Write and fsync a file in place, for a directory nobody reads yet.

    Inside a ``.staging-*`` directory no temp name is needed: discovery never
    looks there, and the directory becomes visible only by a rename after
    its entries were made durable (``fsync_dir``). On a store the object
    exists only once it is complete (a closed upload).
    """
    if storage.is_store(path):
        with path.open("wb") as f:
            write(f)
        return path
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return path


class _Hashed:
    """A binary file that hashes the bytes written through it: a file's SHA-256 in the pass that writes it."""

    def __init__(self, file: BinaryIO):
        self._file, self.sha256 = file, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)  # releases the GIL for large buffers
        return self._file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def hashed(write: Callable[[_Hashed], object], keep: Callable[[str], None]) -> Callable[[BinaryIO], object]:
    """``write`` through a file that hashes the bytes it writes; ``keep`` gets their SHA-256 (hex) once written."""

    def writing(f: BinaryIO) -> None:
        through = _Hashed(f)
        write(through)
        keep(through.sha256.hexdigest())

    return writing


class BackgroundWrite:
    """A :func:`durable_write` running on its own thread.

    Lets the weights file be written (and fsynced) while DCP writes the
    trainer directory: the two files' writes and fsyncs overlap. With
    ``digest`` the bytes are hashed as they are written, on that thread
    (``sha256``, hex, once done), so the marker's digest of the weights file
    costs no second read. :meth:`result` joins the thread and re-raises its error.
    """

    def __init__(
        self,
        path: storage.Location,
        write: Callable[[BinaryIO | _Hashed], object],
        nbytes: int = 0,
        *,
        digest: bool = False,
    ):
        self.path, self.nbytes = path, nbytes  # what it writes, and about how many bytes (for a full disk's error)
        self.sha256: str | None = None
        self._error: BaseException | None = None
        target = hashed(write, self._keep) if digest else write
        self._thread = threading.Thread(
            target=self._run, args=(path, target), name=f"pimm_fn-write-{path.name}", daemon=True
        )
        self._thread.start()

    def _keep(self, sha256: str) -> None:
        self.sha256 = sha256

    def _run(self, path: storage.Location, write: Callable[[BinaryIO], object]) -> None:
        try:
            durable_write(path, write)
        except BaseException as exc:  # noqa: BLE001 - re-raised by result()
            self._error = exc

    def result(self) -> None:
        """Wait until the file is durable; raise what the write raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def join(self) -> None:
        """Wait for the thread without raising (when another error is already on its way)."""
        self._thread.join()


def weights_write(
    directory: storage.Location, weights: dict[str, Any] | None, *, digest: bool = False
) -> BackgroundWrite:
    """Start writing ``weights`` as ``directory``'s weights file, or, for ``None``, the note saying why there is none.

    ``digest``: hash the file as it is written (``BackgroundWrite.sha256``).
    """
    if weights is None:
        return BackgroundWrite(directory / WEIGHTS_SKIPPED, lambda f: f.write(_SKIPPED_NOTE), digest=digest)
    nbytes = sum(t.numel() * t.element_size() for t in weights.values() if isinstance(t, torch.Tensor))
    return BackgroundWrite(directory / WEIGHTS, lambda f: torch.save(weights, f), nbytes, digest=digest)


def write_marker(
    directory: storage.Location,
    step: int,
    world_size: int,
    *,
    staged: bool = False,
    metrics: dict | None = None,
    files: dict | None = None,
) -> None:
    """Write ``COMPLETE`` into ``directory``; call only after every file is written.

    With ``staged`` the directory is a staging one that is published by a
    rename afterwards: the marker is written in place and the directory
    fsynced once, instead of a temp file and a rename. On a store, which
    has no rename, it is written in place either way (an object appears
    only once whole). ``metrics`` are
    recorded in it (see :func:`marker_payload`). ``files`` is the
    directory's :func:`pimm_fn.checkpoint.files.manifest` (each file's size, and SHA-256
    when asked), which validation checks before the checkpoint is used.
    """
    payload = marker_payload(step, "standard", world_size, metrics)
    if files is not None:
        payload["files"] = files
    text = json.dumps(payload, sort_keys=True).encode()
    if staged or storage.is_store(directory):
        durable_write(directory / MARKER, lambda f: f.write(text))
        fsync_dir(directory)
    else:
        atomic_write(directory / MARKER, lambda f: f.write(text))


_PROBE = f"{STAGING}probe-"  # a crash's leftover is a .staging-* entry: the next save removes it


def probe(directory: storage.Location) -> None:
    """Create, rename and delete a probe in ``directory`` (a local path or a store's): what a save does there.

    Raises:
        OSError: what the storage refused (a store client's own errors too).
    """
    name = f"{_PROBE}{secrets.token_hex(6)}"
    if storage.is_store(directory):
        target = directory / name
        target.write_bytes(b"pimm_fn write probe\n")
        target.unlink()
        return
    made, renamed = directory / name, directory / f"{name}-renamed"
    os.mkdir(made)
    try:
        (made / "probe").write_bytes(b"pimm_fn write probe\n")
        os.rename(made, renamed)
        os.unlink(renamed / "probe")
        os.rmdir(renamed)
    finally:
        for left in (made, renamed):  # what a refusal left behind (nothing when every step went through)
            remove(left)


def check_writable(save_dir: str | os.PathLike[str] | storage.StorePath, *, every_rank: bool) -> None:
    """Each rank that writes probes ``save_dir/model`` (``save_dir`` itself while there is no ``model/``); collective.

    Args:
        save_dir: a local path or a :class:`~.storage.StorePath`.
        every_rank: every rank writes (the standard format); else rank 0 alone.

    Raises:
        CheckpointStorageError: on every rank, when some rank could not write:
            naming each such rank, its host, the path and the reason, and the fix.
    """
    refused = None
    if every_rank or dist.is_main():
        where = _probed(storage.location(save_dir))
        try:
            probe(where)
        except Exception as exc:  # noqa: BLE001 - an OSError, or a store client's own: said on every rank
            refused = (dist.rank(), socket.gethostname(), str(where.absolute()), cause(exc))  # each node's own view
    found = [r for r in dist.all_gather_object(refused) if r is not None]
    if not found:
        return
    ranks = "; ".join(f"rank {rank} (host {host}) at {where}: {why}" for rank, host, where, why in found)
    directory = found[0][2]
    raise CheckpointStorageError(  # the same on every rank: what each rank found, never this rank's own view
        f"save_dir cannot hold checkpoints: a save creates, renames and deletes files there, and {ranks}. This run "
        f"wrote nothing there and trained no step. {unwritable_advice(directory)}"
    )


def _probed(save_dir: storage.Location) -> storage.Location:
    """Where a save writes: ``model/``, or ``save_dir`` while it has none (the first save makes it)."""
    model_dir = save_dir / "model"
    if storage.is_store(save_dir) or model_dir.is_dir():
        return model_dir
    save_dir.mkdir(parents=True, exist_ok=True)  # rank 0 made it with the lock; another node's view may lag
    return save_dir
