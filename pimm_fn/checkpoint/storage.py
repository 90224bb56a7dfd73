"""Where a ``save_dir`` lives: a local path, or a URL on an fsspec store (``s3://``, ``gs://``, ``memory://``).

:func:`location` is the one place that tells them apart. A plain path or a
``file://`` URL is a local :class:`pathlib.Path`, and every local code path
is unchanged (the staging directory, the atomic rename). Any other scheme is
a :class:`StorePath` on the fsspec filesystem of that scheme: the few
``pathlib`` methods the checkpoint code uses (``/``, ``name``, ``parent``,
``exists``, ``is_dir``, ``iterdir``, ``open``, ``read_text``, ``stat``...),
implemented over fsspec. It has no ``__fspath__``: nothing can hand it to
``open()`` or ``os`` by mistake and write a local folder named after a URL.

An unknown scheme, or one whose package is missing, is refused by
:func:`check_url` (``loop()`` calls it before anything is written), naming
what to install: ``pip install 'pimm_fn[s3]'`` for ``s3://``,
``pimm_fn[gcs]`` for ``gs://``.

The top of a store is its bucket (``s3://<bucket>/...``; a container on
Azure), on stores whose fsspec filesystem names one first (it has
``split_path``: s3fs, gcsfs, adlfs). fsspec's ``makedirs`` creates a
missing bucket, so a mistyped name would be created and written into:
:meth:`StorePath.mkdir` never does that, and :meth:`StorePath.make_bucket`
creates one only when asked (``loop(saving=Saving(create_bucket=True))``).
A store without buckets (``memory://``) has no top to check: its first
write makes the folders. The store's options (endpoint, credentials)
come from fsspec's own configuration (``~/.config/fsspec``, ``FSSPEC_S3_*``
variables) or the store's (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...).

>>> location("runs/x"), location("file:///tmp/x")
(PosixPath('runs/x'), PosixPath('/tmp/x'))
>>> str(location("memory://bucket/run") / "model")
'memory://bucket/run/model'
>>> location("nosuchscheme://bucket/x")
Traceback (most recent call last):
ValueError: save_dir 'nosuchscheme://bucket/x': fsspec knows no storage protocol 'nosuchscheme'; ...
"""

from __future__ import annotations

import fnmatch
import os
import pathlib
import re
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import attrs

from pimm_fn.checkpoint.errors import CheckpointStorageError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem
    from typing_extensions import TypeAlias, TypeGuard, TypeIs

__all__ = ["Location", "StorePath", "check_url", "is_store", "is_url", "location"]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
_LOCAL = ("file", "local")
# The pyproject extra that installs a scheme's fsspec package.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


def is_url(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a string naming a scheme (``s3://...``); ``pathlib`` paths never are."""
    return isinstance(value, str) and _URL.match(value) is not None


def is_store(path: object) -> TypeIs[StorePath]:
    """Whether ``path`` lives on an fsspec store (a :class:`StorePath`), not the local file system."""
    return isinstance(path, StorePath)


def location(value: str | os.PathLike[str] | StorePath) -> Location:
    """``value`` as a local ``Path`` (a plain path, ``file://``) or a :class:`StorePath` (any other scheme).

    Raises:
        ValueError: an unknown scheme, or one whose package is missing (:func:`check_url`).
    """
    if isinstance(value, (StorePath, pathlib.Path)):
        return value
    if not is_url(value):
        return pathlib.Path(value)
    scheme = _scheme(value).lower()
    if scheme in _LOCAL:
        return pathlib.Path(value[len(scheme) + 3 :] or "/")
    check_url(value)
    return StorePath.from_url(value)


def _scheme(url: str) -> str:
    """The scheme ``url`` names, as written (``s3`` of ``s3://bucket``); a ``ValueError`` when it names none."""
    match = _URL.match(url)
    if match is None:
        raise ValueError(f"{url!r} is not a URL: it names no scheme (s3://, gs://, memory://, ...)")
    return match.group(1)


def check_url(url: str, *, what: str = "save_dir") -> None:
    """Refuse a URL that cannot work, before anything is written: an unknown scheme, or a missing package.

    Raises:
        ValueError: naming the scheme and what to install (``pip install 'pimm_fn[s3]'``); ``url``
            naming no scheme at all.
    """
    import fsspec  # noqa: PLC0415 - only a URL save_dir needs it

    scheme = _scheme(url).lower()
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        extra = _EXTRAS.get(scheme)
        fix = f"pip install 'pimm_fn[{extra}]'" if extra else f"install the fsspec package for {scheme!r} ({exc})"
        raise ValueError(
            f"{what} {url!r} is on {scheme}://, whose storage package is not installed; {fix}, or pass a local path"
        ) from None
    except ValueError:
        raise ValueError(
            f"{what} {url!r}: fsspec knows no storage protocol {scheme!r}; use a local path or a "
            f"URL fsspec knows (s3://, gs://, memory://, file://, ...)"
        ) from None


def _filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    from fsspec.core import url_to_fs  # noqa: PLC0415

    return url_to_fs(url)


@attrs.frozen(repr=False)
class StorePath:
    """A file or directory on an fsspec store, with the ``pathlib`` methods the checkpoint code uses.

    Attributes:
        url: ``scheme://...``, without a trailing slash; what ``str()`` shows and what it pickles as.
        fs: the fsspec filesystem (fsspec caches one per scheme and options).
        path: the store's own name for it (``bucket/run/model``).
    """

    url: str
    fs: AbstractFileSystem = attrs.field(eq=False)
    path: str = attrs.field(eq=False)

    @classmethod
    def from_url(cls, url: str) -> "StorePath":
        fs, path = _filesystem(url)
        scheme = _scheme(url)
        path = path.rstrip("/") or path
        return cls(f"{scheme}://{url[len(scheme) + 3 :].rstrip('/')}", fs, path)

    def __reduce__(self) -> tuple[Callable[[str], StorePath], tuple[str]]:
        # A process rebuilds its own filesystem from the URL (another rank, a worker).
        return (StorePath.from_url, (self.url,))

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"StorePath({self.url!r})"

    def __fspath__(self) -> NoReturn:  # never a local path: the guard against a local folder named after a URL
        raise TypeError(f"{self.url} is on an fsspec store, not a local path")

    def __truediv__(self, name: str) -> "StorePath":
        name = str(name).strip("/")
        if not name:  # as pathlib's ``path / ""``: the path itself
            return self
        return StorePath(f"{self.url}/{name}", self.fs, f"{self.path}/{name}")

    def __lt__(self, other: "StorePath") -> bool:
        return self.url < other.url

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def with_suffix(self, suffix: str) -> "StorePath":
        return self.parent / (self.stem + suffix)

    @property
    def suffix(self) -> str:
        return pathlib.PurePosixPath(self.name).suffix

    @property
    def stem(self) -> str:
        return pathlib.PurePosixPath(self.name).stem

    @property
    def parent(self) -> "StorePath":
        url, path = self.url.rsplit("/", 1)[0], self.path.rsplit("/", 1)[0]
        return StorePath(url, self.fs, path) if "/" in self.path else self

    def absolute(self) -> "StorePath":
        return self

    def relative_to(self, other: Location) -> pathlib.PurePosixPath:
        if not isinstance(other, StorePath) or not self.path.startswith(other.path + "/"):
            raise ValueError(f"{self} is not inside {other}")
        return pathlib.PurePosixPath(self.path[len(other.path) + 1 :])

    def as_posix(self) -> str:
        return self.url

    # -- looking ---------------------------------------------------------------------------------
    def _fresh(self) -> None:
        """Forget listings cached earlier: another process (a rank, an earlier run) may have written since."""
        self.fs.invalidate_cache(self.path)

    def _info(self) -> dict[str, Any] | None:
        self._fresh()
        try:
            return self.fs.info(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def exists(self) -> bool:
        return self._info() is not None

    def is_file(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "file"

    def is_dir(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "directory"

    def is_symlink(self) -> bool:
        return False

    def stat(self) -> types.SimpleNamespace:
        info = self._info()
        if info is None:
            raise FileNotFoundError(f"{self.url} does not exist")
        return types.SimpleNamespace(st_size=int(info.get("size") or 0))

    def iterdir(self) -> list["StorePath"]:
        self._fresh()
        try:
            names = self.fs.ls(self.path, detail=False)
        except FileNotFoundError:
            return []
        found = {n.rstrip("/").rsplit("/", 1)[-1] for n in names}
        return [self / n for n in sorted(found) if n]

    def glob(self, pattern: str) -> list["StorePath"]:
        return [p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)]

    def files(self) -> dict[str, int]:
        """``{relative path: size}`` of every file below this directory (one listing)."""
        self._fresh()
        found = self.fs.find(self.path, detail=True)
        head = self.path + "/"
        return {
            name[len(head) :]: int(info.get("size") or 0)
            for name, info in found.items()
            if name.startswith(head) and info.get("type") == "file"
        }

    # -- reading and writing ---------------------------------------------------------------------
    def open(self, mode: str = "rb") -> Any:  # fsspec's file object: fsspec ships no types
        if "r" in mode:
            self._fresh()
        return self.fs.open(self.path, mode)

    def read_bytes(self) -> bytes:
        self._fresh()
        return self.fs.cat_file(self.path)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        self.fs.pipe_file(self.path, data)
        return len(data)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Make this directory, never its bucket: a missing bucket is a ``CheckpointStorageError`` naming it."""
        bucket = self.bucket
        if bucket is not None and not bucket.bucket_exists():
            raise CheckpointStorageError(bucket.missing_bucket(self, done="nothing was written there"))
        self.fs.makedirs(self.path, exist_ok=True)  # object stores have no directories: a no-op there

    # -- the top of the store --------------------------------------------------------------------
    @property
    def bucket(self) -> "StorePath | None":
        """The bucket this path is in, on a store that has buckets (see the module); ``None`` on one that has none."""
        if not callable(getattr(self.fs, "split_path", None)):
            return None
        top = self.path.split("/", 1)[0]
        return StorePath(f"{self.url.split('://', 1)[0]}://{top}", self.fs, top)

    def bucket_exists(self) -> bool:
        """Whether this bucket exists; ``True`` when the store will not say (no right to look: a write will tell)."""
        self._fresh()
        try:
            self.fs.info(self.path)
        except FileNotFoundError:
            return False
        except PermissionError:
            return True
        return True

    def missing_bucket(self, inside: "StorePath", *, done: str) -> str:
        """What to say of this bucket, missing, where ``inside`` was to be written; ``done``: what came of it."""
        return (
            f"the bucket {self.path!r} of {inside} does not exist, and pimm_fn creates no bucket unless asked (a "
            f"mistyped name would be created and written into); {done}. Check the name, create the bucket with the "
            f"store's own tools, or pass loop(..., saving=pimm_fn.Saving(create_bucket=True))"
        )

    def make_bucket(self) -> None:
        """Create this bucket (the store's default region and settings)."""
        self.fs.mkdir(self.path)
        self._fresh()

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_tree(self) -> None:
        """Delete everything under this directory (or this file)."""
        try:
            self.fs.rm(self.path, recursive=True)
        except FileNotFoundError:
            pass
        self._fresh()


Location: TypeAlias = pathlib.Path | StorePath
"""Where a checkpoint's files are: a local path, or a :class:`StorePath` (what :func:`location` returns)."""
