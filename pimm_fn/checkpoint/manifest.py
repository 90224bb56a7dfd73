"""What a save records of its files in the marker: each one's size and, when asked, its SHA-256.

Rank 0 lists the staging directory once every rank's files are written
(``manifest``); the weights file's digest is computed as it is written
(``_safe_writes.BackgroundWrite``), every other file is read once, in
parallel. :mod:`.validation` checks the record before a checkpoint is used,
hashing with the same ``digest``.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from concurrent.futures import ThreadPoolExecutor

from . import _layout as L
from . import regular_files, storage

__all__ = ["digest", "manifest"]

_BLOCK = 8 * 2**20  # bytes hashed per read: large blocks, one pass over each file


def digest(path: str | os.PathLike) -> str:
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
    with path.open("rb") if storage.is_store(path) else regular_files.open_regular(path) as f:
        while n := f.readinto(buffer):
            sha.update(view[:n])  # hashlib releases the GIL for large updates: the training thread runs on
    return sha.hexdigest()


def manifest(directory: pathlib.Path, *, digests: bool = False, known: dict | None = None) -> dict:
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
    listed = [rel for rel in sizes if rel != L.MARKER and not rel.startswith(f"{L.RECEIPTS}/")]
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
