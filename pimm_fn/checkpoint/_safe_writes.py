"""Writing a checkpoint's files so that a crash never leaves one that looks whole.

A file replaced atomically (a temp name, then ``os.replace``), staged under
a ``.staging-`` name for the caller to rename, written and fsynced in place
inside a directory nobody reads yet, or on its own thread beside DCP (the
weights file, hashed as it is written); and the ``COMPLETE`` marker, written
after every other file (:mod:`._layout` names them).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import secrets
import threading
from typing import Callable

import torch

from . import storage
from ._layout import MARKER, STAGING, WEIGHTS, WEIGHTS_SKIPPED
from ._marker import marker_payload

__all__ = [
    "fsync_dir", "atomic_write", "staged_write", "durable_write", "hashed", "BackgroundWrite", "weights_write",
    "write_marker",
]

_SKIPPED_NOTE = (
    b"This checkpoint has no model.pth: it was saved from a sharded model with loop(saving=Saving(weights_file=False)).\n"
    b"The weights are the sharded/model/ entries of trainer/ (a DCP directory);\n"
    b"pimm_fn.checkpoint.load_weights_file('<this directory>') assembles them into a full state dict.\n"
)


def fsync_dir(path: pathlib.Path) -> None:
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


def atomic_write(path: pathlib.Path, write: Callable[[object], None]) -> pathlib.Path:
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


def staged_write(path: pathlib.Path, write: Callable[[object], None]) -> pathlib.Path:
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


def durable_write(path: pathlib.Path, write: Callable[[object], None]) -> pathlib.Path:
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

    def __init__(self, file):
        self._file, self.sha256 = file, hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)  # releases the GIL for large buffers
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)


def hashed(write: Callable[[object], None], keep: Callable[[str], None]) -> Callable[[object], None]:
    """``write`` through a file that hashes the bytes it writes; ``keep`` gets their SHA-256 (hex) once written."""
    def writing(f) -> None:
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

    def __init__(self, path: pathlib.Path, write: Callable[[object], None], nbytes: int = 0, *, digest: bool = False):
        self.path, self.nbytes = path, nbytes  # what it writes, and about how many bytes (for a full disk's error)
        self.sha256: str | None = None
        self._error: BaseException | None = None
        target = hashed(write, self._keep) if digest else write
        self._thread = threading.Thread(target=self._run, args=(path, target), name=f"pimm_fn-write-{path.name}", daemon=True)
        self._thread.start()

    def _keep(self, sha256: str) -> None:
        self.sha256 = sha256

    def _run(self, path: pathlib.Path, write: Callable[[object], None]) -> None:
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


def weights_write(directory: pathlib.Path, weights: dict | None, *, digest: bool = False) -> BackgroundWrite:
    """Start writing ``weights`` as ``directory``'s weights file, or, for ``None``, the note saying why there is none.

    ``digest``: hash the file as it is written (``BackgroundWrite.sha256``).
    """
    if weights is None:
        return BackgroundWrite(directory / WEIGHTS_SKIPPED, lambda f: f.write(_SKIPPED_NOTE), digest=digest)
    nbytes = sum(t.numel() * t.element_size() for t in weights.values() if isinstance(t, torch.Tensor))
    return BackgroundWrite(directory / WEIGHTS, lambda f: torch.save(weights, f), nbytes, digest=digest)


def write_marker(
    directory: pathlib.Path, step: int, world_size: int, *, staged: bool = False, metrics: dict | None = None,
    files: dict | None = None,
) -> None:
    """Write ``COMPLETE`` into ``directory``; call only after every file is written.

    With ``staged`` the directory is a staging one that is published by a
    rename afterwards: the marker is written in place and the directory
    fsynced once, instead of a temp file and a rename. ``metrics`` are
    recorded in it (see :func:`marker_payload`). ``files`` is the
    directory's :func:`.manifest.manifest` (each file's size, and SHA-256
    when asked), which validation checks before the checkpoint is used.
    """
    payload = marker_payload(step, "standard", world_size, metrics)
    if files is not None:
        payload["files"] = files
    text = json.dumps(payload, sort_keys=True).encode()
    if staged:
        durable_write(directory / MARKER, lambda f: f.write(text))
        fsync_dir(directory)
    else:
        atomic_write(directory / MARKER, lambda f: f.write(text))
