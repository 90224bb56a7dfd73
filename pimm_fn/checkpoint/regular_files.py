"""Reading a small file under a ``save_dir`` (a marker, a best-model record, a lock) as the untrusted input it is.

Anything under a ``save_dir`` may be damaged or crafted. A FIFO in place of
``COMPLETE`` once made ``resume="auto"`` and ``ls`` wait forever, and
``"[" * 100000`` made them fail with a ``RecursionError``. So these reads
take only a regular file: never through a symbolic link, never blocking on
a FIFO, never opening a device, and at most ``limit`` bytes of it; JSON
nested too deep is a ``ValueError`` like any other malformed JSON. An
fsspec store's object (a store has no links, FIFOs or devices) is read as
it is.

Every reader here raises:

- ``FileNotFoundError``: the file is not there.
- :class:`NotRegularFileError` (an ``OSError``): a link, FIFO, device or
  directory where the file belongs: never followed, opened or read.
- ``OSError``: the file cannot be read.
- ``ValueError``: it is larger than ``limit``, or (text, JSON) does not decode.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import BinaryIO

from . import storage

__all__ = ["MAX_BYTES", "NotRegularFileError", "open_regular", "read_bytes", "read_json", "read_text"]

MAX_BYTES = 16 * 2**20
"""The default ``limit``: far above any marker, record or lock pimm_fn writes, far below what could exhaust memory."""

_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(OSError):
    """A link, FIFO, device or directory where a regular file belongs: what it is, in ``strerror``."""


def _refuse_unless_regular(path, mode: int) -> None:
    """Raise :class:`NotRegularFileError` naming what ``path`` is, unless ``mode`` is a regular file's."""
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise NotRegularFileError(errno.EINVAL, f"is {kind}, not a regular file", str(path))


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading once sure it is a regular file: a link, FIFO or device is never opened.

    The ``lstat`` before the open keeps devices and FIFOs unopened; the flags
    and the ``fstat`` after it refuse one swapped in between (no wait on a FIFO).

    >>> import pathlib, tempfile
    >>> fifo = pathlib.Path(tempfile.mkdtemp()) / "COMPLETE"
    >>> os.mkfifo(fifo)
    >>> open_regular(fifo)
    Traceback (most recent call last):
    pimm_fn.checkpoint.regular_files.NotRegularFileError: [Errno 22] is a FIFO, not a regular file: '...COMPLETE'
    """
    _refuse_unless_regular(path, os.lstat(path).st_mode)
    fd = os.open(path, _FLAGS)
    try:
        _refuse_unless_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def read_bytes(path: str | os.PathLike, *, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path``, refused past ``limit`` bytes (a store's object read as it is)."""
    if storage.is_store(path):
        data = path.read_bytes()
    else:
        with open_regular(path) as f:
            data = f.read(limit + 1)  # one byte over tells "too large" without reading the rest
    if len(data) > limit:
        raise ValueError(f"over {limit:,} bytes: far more than such a file holds")
    return data


def read_text(path: str | os.PathLike, *, limit: int = MAX_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (``UnicodeDecodeError`` is a ``ValueError``)."""
    return read_bytes(path, limit=limit).decode("utf-8")


def read_json(path: str | os.PathLike, *, limit: int = MAX_BYTES) -> object:
    """The JSON value the regular file ``path`` holds; malformed or too deeply nested JSON is a ``ValueError``.

    >>> import pathlib, tempfile
    >>> deep = pathlib.Path(tempfile.mkdtemp()) / "model_best.json"
    >>> _ = deep.write_text("[" * 100000)
    >>> read_json(deep)
    Traceback (most recent call last):
    ValueError: nested too deeply to parse
    """
    data = read_bytes(path, limit=limit)
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None
