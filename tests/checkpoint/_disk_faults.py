"""Disk faults for tests: a file damaged in place, a full disk injected where the OS reports it, and storage
that refuses writes.

``damage(path, how)`` cuts a file short, empties it, zeroes or overwrites
its bytes at the same size, or deletes it, as a copy cut short or a stray
write would.

``full_disk(root, match)`` replaces ``open`` and ``io.open`` (which
``open()``, ``Path.open``, ``os.fdopen`` and so ``torch.save``, DCP's writer
and every temp-file write go through) while it is active: a file opened for
writing under ``root`` whose path contains ``match`` takes ``room`` bytes,
then each write raises ``OSError(ENOSPC)``, as a write(2) on a full
filesystem does. Nothing of pimm_fn is replaced. Importable by the
distributed workers too (no pytest).

``unwritable(path)`` makes a directory or file refuse every change, by the
OS itself, for root too (tests run as root here and in CI containers, and
root's writes pass any mode bits): the immutable flag (``chattr +i``, set
with the ``FS_IOC_SETFLAGS`` ioctl, no ``chattr`` binary needed). Nothing
can be created, renamed or deleted in such a directory, and it cannot be
renamed or deleted itself. Setting the flag needs ``CAP_LINUX_IMMUTABLE``
(root has it on a host; a container gets it with ``--cap-add
LINUX_IMMUTABLE``) and a filesystem that keeps it (ext4, xfs, btrfs, tmpfs
since Linux 6.0): :func:`why_not_unwritable` says why not where it cannot
be had, for the test to skip with that reason.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import hashlib
import io
import os
import pathlib
import random
import struct


def hashes(root) -> dict:
    """``{relative path: SHA-256}`` of every file under ``root``: to show that a refusal changed nothing."""
    root = pathlib.Path(root)
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def damage(path, how: str) -> None:
    """Damage one file in place: ``truncate`` (half), ``empty``, ``zeros``/``garbage`` (same size) or ``delete``."""
    path = pathlib.Path(path)
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "zeros":
        path.write_bytes(bytes(len(data)))
    elif how == "garbage":
        path.write_bytes(random.Random(3).randbytes(len(data)))
    elif how == "delete":
        path.unlink()
    else:
        raise ValueError(f"damage: unknown how={how!r}")


class _Full:
    """A writable file whose writes fail with ENOSPC once ``room`` bytes went in."""

    def __init__(self, file, path: str, room: int, hits: list):
        self._file, self._path, self._room, self._hits = file, path, room, hits

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size > self._room:
            self._hits.append(self._path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)
        self._room -= size
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


@contextlib.contextmanager
def full_disk(root, match: str, room: int = 0):
    """While active, files under ``root`` whose path contains ``match`` fill up after ``room`` bytes.

    Yields:
        The list of paths whose write failed (a test asserts the failure was injected).
    """
    real_open, root, hits = io.open, os.path.abspath(os.fspath(root)), []

    def open_(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        path = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else os.path.abspath(os.fspath(file))
        writing = any(flag in mode for flag in "wax+")
        if writing and path.startswith(root + os.sep) and match in os.path.relpath(path, root):
            return _Full(opened, path, room, hits)
        return opened

    builtins.open, io.open = open_, open_
    try:
        yield hits
    finally:
        builtins.open, io.open = real_open, real_open


# linux/fs.h: the inode flags ioctls (an int, whatever their declared long) and the immutable flag.
_GETFLAGS, _SETFLAGS, _IMMUTABLE = 0x80086601, 0x40086602, 0x00000010


def _set_immutable(path, on: bool) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, _GETFLAGS, struct.pack("i", 0)))[0]
        flags = flags | _IMMUTABLE if on else flags & ~_IMMUTABLE
        fcntl.ioctl(fd, _SETFLAGS, struct.pack("i", flags))
    finally:
        os.close(fd)


def why_not_unwritable(scratch) -> str | None:
    """Why :func:`unwritable` cannot be had under the directory ``scratch`` (``None``: it can), tried on a probe."""
    probe = pathlib.Path(scratch) / ".immutable-probe"
    probe.mkdir(exist_ok=True)
    try:
        _set_immutable(probe, True)
    except OSError as exc:
        return (
            f"no way to make a directory unwritable here: the immutable flag (chattr +i) was refused "
            f"({exc.strerror}); it needs CAP_LINUX_IMMUTABLE (a container: --cap-add LINUX_IMMUTABLE) and a "
            f"filesystem that keeps the flag (ext4, xfs, btrfs, tmpfs)"
        )
    try:
        (probe / "x").touch()
        return "the immutable flag was set but did not stop a write here"
    except OSError:
        return None
    finally:
        _set_immutable(probe, False)
        for left in probe.iterdir():
            left.unlink()
        probe.rmdir()


@contextlib.contextmanager
def unwritable(path):
    """While active, ``path`` (a directory or a file) refuses every change, root's too: created, renamed, deleted."""
    _set_immutable(path, True)
    try:
        yield path
    finally:
        _set_immutable(path, False)
