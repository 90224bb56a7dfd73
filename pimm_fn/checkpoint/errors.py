"""What can go wrong with checkpoints on disk, as four errors, each saying what to do.

- :class:`CheckpointError` (a ``ValueError``): a checkpoint on disk cannot
  be used: a file is missing, cut short or overwritten, or its ``COMPLETE``
  marker does not parse. It names the checkpoint, the file and what is
  wrong, and points to an older checkpoint. Raised by ``find_checkpoint``,
  ``load_checkpoint`` and ``loop(resume=<path>)``; ``resume="auto"`` skips
  such a checkpoint instead, saying so, and raises one naming each when
  none is usable (``discovery.NoIntactCheckpointError``).
- :class:`CheckpointStorageError` (a ``RuntimeError``): a save could not be
  written where it had to go (a ``save_dir`` that is not shared between
  nodes, a directory this process may not write, a read-only file system,
  a bucket that does not exist); it names the path and what to do, and
  says what was kept (nothing was published).
- :class:`DiskFullError` (a ``CheckpointStorageError`` and an ``OSError``
  with ``errno.ENOSPC``): the same because the disk is full. It says
  ``No space left on device`` and names the directory and the bytes.

``pimm_fn.ResumeError`` is the remaining case: a sound checkpoint that does
not fit this run (other hooks, other optimizers).

What torch raises underneath is translated here: DCP's
``CheckpointException`` derives from ``BaseException`` (an ``except
Exception`` misses it), ``torch.save`` turns a full disk into ``unexpected
pos``, and ``torch.load`` advises ``weights_only=False``, which would run
code from the file: that advice is never repeated.
- :class:`SaveDirLockError` (a ``RuntimeError``): ``save_dir``'s lock cannot
  be taken: another run holds it (naming the holder), or the storage is read-only.
"""

from __future__ import annotations

import contextlib
import errno
import pathlib
import re
from typing import Callable

from torch.distributed.checkpoint.api import CheckpointException

from pimm_fn import dist

__all__ = ["CheckpointError", "CheckpointStorageError", "DiskFullError", "SaveDirLockError"]

_FULL = (errno.ENOSPC, errno.EDQUOT)


class CheckpointError(ValueError):
    """A checkpoint on disk cannot be used: which one, which file, what is wrong, and what to do.

    Attributes:
        path: the checkpoint (directory, or file for the legacy format).
        file: the damaged file, relative to ``path`` (the file's own name for a legacy file).
        problem: what is wrong with it, e.g. ``"is 0 bytes, the marker records 4,096 (cut short)"``.
        advice: what to do, when not the default (use an older checkpoint): a best-model file's, say.

    Example:
        >>> print(CheckpointError("runs/x/model/last", "model.pth", "is missing").summary())
        checkpoint runs/x/model/last: model.pth is missing
    """

    # ``path``: a local path or a store's (``storage.StorePath``, which imports this module), kept as its str().
    def __init__(self, path: object, file: str, problem: str, advice: str | None = None) -> None:
        self.path, self.file, self.problem, self.advice = str(path), file, problem, advice
        super().__init__(f"{self.summary()}. {advice if advice is not None else _advice(self.path)}")

    def summary(self) -> str:
        """The checkpoint, the file and the problem, without the advice."""
        return f"checkpoint {self.path}: {self.file} {self.problem}"

    def __reduce__(self):
        return (type(self), (self.path, self.file, self.problem, self.advice))


class CheckpointStorageError(RuntimeError):
    """A save could not be written where it had to go (``save_dir`` not shared, a failed write); nothing was published."""


class DiskFullError(CheckpointStorageError, OSError):
    """A save or best-model write ran out of space: ``errno`` is ENOSPC; names the directory and the bytes.

    Example:
        >>> print(DiskFullError("runs/x/model", 1024, "model_best.pth", "the previous model_best is intact"))
        [Errno 28] No space left on device: writing model_best.pth (1,024 bytes) under runs/x/model failed; the
        previous model_best is intact. Free space on that disk (or choose another save_dir), then continue with
        resume='auto'
    """

    def __init__(self, directory: object, nbytes: int, what: str, consequence: str) -> None:
        self.directory, self.nbytes, self.what, self.consequence = str(directory), int(nbytes), what, consequence
        OSError.__init__(
            self,
            errno.ENOSPC,
            f"No space left on device: writing {what} ({self.nbytes:,} bytes) under {self.directory} failed; "
            f"{consequence}. Free space on that disk (or choose another save_dir), then continue with resume='auto'",
        )

    def __reduce__(self):
        return (type(self), (self.directory, self.nbytes, self.what, self.consequence))


def _advice(path: str) -> str:
    parent = (
        path.rstrip("/").rsplit("/", 1)[0] if "://" in path else pathlib.PurePath(path).parent
    )  # a URL keeps its //
    return (
        f"Use an older checkpoint: list them with `python -m pimm_fn ls {parent}` and pass one's path (to resume= "
        "or to a warm start's load_weights), or resume with resume='auto', which skips damaged checkpoints"
    )


def _behind(exc: BaseException | None, wanted: Callable[[OSError], bool]) -> OSError | None:
    """The first ``wanted`` ``OSError`` behind ``exc``: itself, its cause or context, or a DCP rank's failure."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and wanted(exc):
            return exc
        if isinstance(exc, CheckpointException):
            for failure, _ in exc.failures.values():
                found = _behind(failure, wanted)
                if found is not None:
                    return found
        exc = exc.__cause__ or exc.__context__
    return None


def no_space(exc: BaseException | None) -> OSError | None:
    """The ENOSPC (or EDQUOT) ``OSError`` behind ``exc``: itself, its cause or context, or a DCP rank's failure."""
    return _behind(exc, lambda error: error.errno in _FULL)


def os_error(exc: BaseException | None) -> OSError | None:
    """The ``OSError`` behind ``exc`` (a permission refused, a read-only file system...), as :func:`no_space` finds one."""
    return _behind(exc, lambda error: True)


def shown(value, limit: int = 60) -> str:
    """A value read from a checkpoint, for a message: its repr cut to ``limit``, never raising.

    >>> shown(list(range(30)), 20)
    '[0, 1, 2, 3, 4, 5...'
    """
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int of more digits than Python prints, a list nested too deep
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def cause(exc: BaseException) -> str:
    """One line saying why a read failed: DCP's first rank failure unwrapped, torch's unsafe advice left out."""
    if isinstance(exc, CheckpointException) and exc.failures:
        return cause(exc.failures[min(exc.failures)][0])
    text = str(exc)
    if "weights_only" in text:  # torch's advice to load with weights_only=False would execute the file's code
        found = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\n\s*\n|Check the documentation|$)", text, re.S)
        refused = f" ({' '.join(found.group(1).split())})" if found else ""
        text = f"it holds what a safe load refuses{refused}"
    text = " ".join(text.split())
    return f"{type(exc).__name__}: {text[:200]}"


def _own_ctrl_c(exc: CheckpointException) -> KeyboardInterrupt | None:
    """The Ctrl-C that stopped this rank's part of a DCP write, which DCP hands back wrapped as a rank failure."""
    failure = exc.failures.get(dist.rank(), (None,))[0]
    return failure if isinstance(failure, KeyboardInterrupt) else None


def unwritable_advice(directory) -> str:
    """What to do when ``directory`` cannot be written: the one fix every such error gives.

    >>> print(unwritable_advice("runs/x/model"))
    Make runs/x/model writable by this user on every node (its permissions, a read-only mount, an immutable flag, a store's credentials), or choose another save_dir; then continue with resume='auto'
    """
    return (
        f"Make {directory} writable by this user on every node (its permissions, a read-only mount, an immutable "
        f"flag, a store's credentials), or choose another save_dir; then continue with resume='auto'"
    )


def storage_error(
    exc: BaseException,
    directory,
    nbytes: int | Callable[[], int],
    what: str,
    consequence: str,
    *,
    doing: str = "writing",
):
    """``exc`` as a :class:`DiskFullError` when space ran out, a :class:`CheckpointStorageError` when the storage
    refused (an ``OSError``, or DCP's failure on some rank), else itself.

    The storage error names ``directory``, what failed (``doing`` ``what``:
    "writing the snapshot iter_8"), the OS's reason, the ``consequence``
    (what was kept) and, for an ``OSError``, the fix. A Ctrl-C that landed
    inside DCP's write comes back as the ``KeyboardInterrupt`` it was: an
    interruption (a script's advice, a notebook's exact continuation), not a
    storage failure.
    """
    if isinstance(exc, (CheckpointError, CheckpointStorageError)):
        return exc
    if isinstance(exc, CheckpointException) and _own_ctrl_c(exc) is not None:
        return _own_ctrl_c(exc)
    if no_space(exc) is not None:
        return DiskFullError(directory, nbytes() if callable(nbytes) else nbytes, what, consequence)
    if isinstance(exc, (CheckpointException, OSError)):
        ranks = ""
        if isinstance(exc, CheckpointException) and dist.world_size() > 1:
            ranks = f" on rank(s) {sorted(exc.failures)}"
        fix = f". {unwritable_advice(directory)}" if os_error(exc) is not None else ""  # the storage refused: say how
        return CheckpointStorageError(
            f"{doing} {what} under {directory} failed{ranks}: {cause(exc)}; {consequence}{fix}"
        )
    return exc


@contextlib.contextmanager
def storage_errors(directory, nbytes: int | Callable[[], int], what: str, consequence: str, *, doing: str = "writing"):
    """Raise what fails inside as :func:`storage_error` says (the OS error kept as the cause)."""
    try:
        yield
    except BaseException as exc:
        converted = storage_error(exc, directory, nbytes, what, consequence, doing=doing)
        if converted is exc:
            raise
        raise converted from (no_space(exc) or os_error(exc))


SHARED = (CheckpointError, CheckpointStorageError)
"""The errors :func:`pimm_fn.dist.run_on_main` raises as themselves on every rank (``shared=SHARED``)."""


def tensor_bytes(*trees) -> int:
    """The bytes of every tensor in nested dicts, lists and tuples (a DTensor's local shard)."""
    total = 0
    stack = list(trees)
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "element_size") and hasattr(item, "numel"):
            local = item.to_local() if hasattr(item, "to_local") else item
            total += local.numel() * local.element_size()
    return total


class SaveDirLockError(RuntimeError):
    """``save_dir``'s lock cannot be taken: another run holds it (``holder``), or its storage is read-only.

    Attributes:
        holder: the :class:`pimm_fn.checkpoint.lock.Holder` named in the lock file (``None`` when it could not be read).
        read_only: the lock file could not be created: ``save_dir`` cannot be written.
    """

    def __init__(self, message: str, holder: object | None = None, read_only: bool = False) -> None:
        super().__init__(message)
        self.holder, self.read_only = holder, read_only

    def __reduce__(self):
        return (type(self), (str(self), self.holder, self.read_only))


class NoIntactCheckpointError(CheckpointError):
    """``resume="auto"`` found checkpoints and none is usable: it refuses to start fresh over them.

    Attributes:
        path: the model directory.
        rejected: ``(checkpoint, "step <n>", file, problem)`` for each, newest first.
        file, problem: the newest one's.
    """

    def __init__(self, model_dir, rejected: tuple):
        self.rejected = tuple(tuple(r) for r in rejected)
        self.path, self.file, self.problem = str(model_dir), self.rejected[0][2], self.rejected[0][3]
        ValueError.__init__(self, self._message())

    def summary(self) -> str:
        return f"no intact checkpoint in {self.path}: {len(self.rejected)} rejected"

    def _message(self) -> str:
        lines = "".join(f"\n  {path} ({step}): {file} {problem}" for path, step, file, problem in self.rejected)
        save_dir = pathlib.PurePath(self.path).parent
        return (
            f"resume='auto' found checkpoints in {self.path} but none is intact, and will not start fresh over "
            f"them (the new run's first save would replace them):{lines}\n"
            f"Repair one (`python -m pimm_fn verify {self.path}` says what is wrong), move them aside "
            f"(mv {self.path} {self.path}.rejected) to start fresh, or pass resume=None with a new save_dir "
            f"(not {str(save_dir)!r})"
        )

    def __reduce__(self):
        return (type(self), (self.path, self.rejected))


class NotRegularFileError(OSError):
    """A link, FIFO, device or directory where a regular file belongs: what it is, in ``strerror``."""

    strerror: str  # always given: NotRegularFileError(errno, what it is, the path)


class SetAsideWarning(UserWarning):
    """A save found a checkpoint it could not read where it writes, and kept it under another name."""
